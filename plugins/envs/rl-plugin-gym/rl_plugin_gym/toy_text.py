"""Formatters that describe gymnasium's toy-text games in words (rows and columns count from 1).

Each one reads the live env (``env.unwrapped``) for what the observation integer hides: the map,
the cards, the stop names. They are registered in :data:`FORMATS` by game name without version.
"""

from __future__ import annotations

from typing import Any

from .text_format import GameFormat

_CELL = {"S": "the start", "F": "frozen ice", "H": "a hole", "G": "the goal"}
_MOVES = {"LEFT": (0, -1), "DOWN": (1, 0), "RIGHT": (0, 1), "UP": (-1, 0)}


def _grid_lines(rows: list[list[str]], at: tuple[int, int], mark: str = "P") -> str:
    out = []
    for r, row in enumerate(rows):
        out.append(" ".join(mark if (r, c) == at else ch for c, ch in enumerate(row)))
    return "\n".join(out)


def _pos(r: int, c: int) -> str:
    return f"row {r + 1}, column {c + 1}"


class FrozenLakeFormat(GameFormat):
    """``show_map=False`` leaves the map out of each state (position, goal and the four neighbours
    are enough to play): a third of the tokens per turn, which is what a long episode costs."""

    action_names = ("LEFT", "DOWN", "RIGHT", "UP")
    aliases = {"WEST": "LEFT", "SOUTH": "DOWN", "EAST": "RIGHT", "NORTH": "UP"}

    def __init__(self, show_map: bool = True) -> None:
        self.show_map = show_map

    def _map(self, env: Any) -> list[list[str]]:
        return [[ch.decode() if isinstance(ch, bytes) else str(ch) for ch in row] for row in env.unwrapped.desc]

    def system_message(self, env: Any, choices: str) -> str:
        grid = self._map(env)
        slippery = _is_slippery(env)
        return (
            f"You walk on a frozen lake, a grid of {len(grid)} rows and {len(grid[0])} columns. Reach the goal "
            "without stepping into a hole. Reaching the goal gives reward 1; a hole ends the game with 0."
            + (" The ice is slippery: you may slide sideways instead of moving where you chose." if slippery else "")
            + f" Each turn reply with one move: {choices}."
        )

    def describe(self, obs: Any, env: Any) -> str:
        grid = self._map(env)
        ncol = len(grid[0])
        r, c = divmod(int(obs), ncol)
        goal = next((i, j) for i, row in enumerate(grid) for j, ch in enumerate(row) if ch == "G")
        around = []
        for move, (dr, dc) in _MOVES.items():
            rr, cc = r + dr, c + dc
            if 0 <= rr < len(grid) and 0 <= cc < ncol:
                around.append(f"{move} is {_CELL[grid[rr][cc]]}")
            else:
                around.append(f"{move} is the edge of the lake")
        state = f"You are at {_pos(r, c)}. The goal is at {_pos(*goal)}. Around you: {'; '.join(around)}."
        if not self.show_map:
            return state
        return f"{state}\nMap (P = you, F = ice, H = hole, G = goal, S = start):\n{_grid_lines(grid, (r, c))}"

    def potential(self, obs: Any, env: Any) -> float | None:
        """Minus the grid distance to the goal, as a share of the farthest a cell can be from it."""
        grid = self._map(env)
        r, c = divmod(int(obs), len(grid[0]))
        goal = next((i, j) for i, row in enumerate(grid) for j, ch in enumerate(row) if ch == "G")
        return -_share(abs(goal[0] - r) + abs(goal[1] - c), len(grid), len(grid[0]), goal)

    def outcome(self, action: str, reward: float, terminated: bool, truncated: bool, obs: Any, env: Any) -> str:
        grid = self._map(env)
        r, c = divmod(int(obs), len(grid[0]))
        if terminated and grid[r][c] == "G":
            return f"You chose {action} and reached the goal at {_pos(r, c)}! You win (reward {reward:g})."
        if terminated and grid[r][c] == "H":
            return f"You chose {action} and fell into the hole at {_pos(r, c)}. Game over."
        # on slippery ice the move taken may not be the one chosen: say only what was chosen
        verb = "tried to move" if _is_slippery(env) else "moved"
        if truncated:
            return f"You {verb} {action}. Out of time: the game is over."
        return f"You {verb} {action}.\n{self.describe(obs, env)}"


def _share(distance: int, nrow: int, ncol: int, goal: tuple[int, int]) -> float:
    """``distance`` over the largest grid distance any cell has from ``goal``."""
    farthest = max(goal[0], nrow - 1 - goal[0]) + max(goal[1], ncol - 1 - goal[1])
    return distance / farthest if farthest else 0.0


def _is_slippery(env: Any) -> bool:
    """FrozenLake keeps no ``is_slippery`` flag; a move with several possible outcomes is the tell."""
    table = getattr(env.unwrapped, "P", {})
    return any(len(outcomes) > 1 for moves in table.values() for outcomes in moves.values())


class TaxiFormat(GameFormat):
    action_names = ("SOUTH", "NORTH", "EAST", "WEST", "PICKUP", "DROPOFF")
    aliases = {"DOWN": "SOUTH", "UP": "NORTH", "RIGHT": "EAST", "LEFT": "WEST", "PICK": "PICKUP", "DROP": "DROPOFF"}
    stops = ("Red", "Green", "Yellow", "Blue")

    def system_message(self, env: Any, choices: str) -> str:
        return (
            "You drive a taxi on a 5 by 5 grid with walls. Four stops are marked Red, Green, Yellow and Blue. "
            "Drive to the passenger, pick them up, drive to their destination and drop them off. Each move "
            "costs 1, delivering the passenger earns 20, and a wrong pickup or dropoff costs 10. "
            f"Each turn reply with one action: {choices}."
        )

    def _stop(self, env: Any, i: int) -> str:
        r, c = env.unwrapped.locs[i]
        return f"the {self.stops[i]} stop ({_pos(r, c)})"

    def describe(self, obs: Any, env: Any) -> str:
        u = env.unwrapped
        r, c, passenger, dest = u.decode(int(obs))
        where = "The passenger is in the taxi." if passenger == 4 else f"The passenger waits at {self._stop(env, passenger)}."
        desc = [[ch.decode() if isinstance(ch, bytes) else str(ch) for ch in row] for row in u.desc]
        blocked = []
        if r == 0:
            blocked.append("NORTH")
        if r == len(desc) - 3:
            blocked.append("SOUTH")
        if desc[r + 1][2 * c + 2] == "|":
            blocked.append("EAST")
        if desc[r + 1][2 * c] == "|":
            blocked.append("WEST")
        walls = f" A wall or the edge blocks {', '.join(blocked)}." if blocked else ""
        return (
            f"The taxi is at {_pos(r, c)}.{walls} {where} "
            f"The passenger wants to go to {self._stop(env, dest)}."
        )

    def outcome(self, action: str, reward: float, terminated: bool, truncated: bool, obs: Any, env: Any) -> str:
        if terminated:
            return f"You chose {action} and delivered the passenger (reward {reward:g}). Done!"
        note = " That was not allowed here." if reward <= -10 else ""
        return self.step_report(f"You chose {action}", reward, note, truncated, obs, env)


def _card(v: int) -> str:
    return "an ace" if v == 1 else ("a ten or face card" if v == 10 else f"a {v}")


class BlackjackFormat(GameFormat):
    action_names = ("STICK", "HIT")
    aliases = {"STAND": "STICK", "STAY": "STICK", "DRAW": "HIT"}

    def system_message(self, env: Any, choices: str) -> str:
        return (
            "You play blackjack against the dealer. Get a hand total closer to 21 than the dealer without "
            "going over. HIT draws a card; STICK stops and lets the dealer play. Winning gives reward 1, "
            f"losing -1, a draw 0. Each turn reply with one action: {choices}."
        )

    def describe(self, obs: Any, env: Any) -> str:
        total, showing, usable_ace = (int(x) for x in obs)
        cards = getattr(env.unwrapped, "player", None)
        hand = f"Your cards are {', '.join(_card(int(v)) for v in cards)}" if cards else "Your hand"
        ace = " (an ace counts as 11)" if usable_ace else ""
        return f"{hand}: total {total}{ace}. The dealer shows {_card(showing)}. HIT or STICK?"

    def outcome(self, action: str, reward: float, terminated: bool, truncated: bool, obs: Any, env: Any) -> str:
        if not terminated:
            return f"You chose {action}.\n{self.describe(obs, env)}"
        u = env.unwrapped
        total = int(obs[0])
        dealer = getattr(u, "dealer", [])
        dealer_total = _hand_total([int(v) for v in dealer])
        result = "You win" if reward > 0 else ("You lose" if reward < 0 else "It is a draw")
        if total > 21:
            how = f"You drew to {total} and went bust."
        else:
            how = f"You stand on {total}; the dealer has {dealer_total}."
        return f"You chose {action}. {how} {result} (reward {reward:g})."


def _hand_total(cards: list[int]) -> int:
    total = sum(cards)
    return total + 10 if 1 in cards and total + 10 <= 21 else total


class CliffWalkingFormat(GameFormat):
    action_names = ("UP", "RIGHT", "DOWN", "LEFT")
    aliases = {"NORTH": "UP", "EAST": "RIGHT", "SOUTH": "DOWN", "WEST": "LEFT"}

    def system_message(self, env: Any, choices: str) -> str:
        nrow, ncol = env.unwrapped.shape
        return (
            f"You walk on a grid of {nrow} rows and {ncol} columns from the start (bottom left) to the goal "
            "(bottom right). The cells of the bottom row between them are a cliff: stepping there costs 100 "
            f"and sends you back to the start. Every step costs 1. Each turn reply with one move: {choices}."
        )

    def describe(self, obs: Any, env: Any) -> str:
        nrow, ncol = env.unwrapped.shape
        r, c = divmod(int(obs), ncol)
        rows = [["o"] * ncol for _ in range(nrow)]
        rows[nrow - 1] = ["S"] + ["C"] * (ncol - 2) + ["G"]
        danger = []
        for move, (dr, dc) in _MOVES.items():
            rr, cc = r + dr, c + dc
            if rr == nrow - 1 and 0 < cc < ncol - 1:
                danger.append(move)
        warn = f" Careful: moving {' or '.join(danger)} steps off the cliff." if danger else ""
        steps = abs(nrow - 1 - r) + abs(ncol - 1 - c)
        return (
            f"You are at {_pos(r, c)}. The goal is at {_pos(nrow - 1, ncol - 1)}, {steps} steps away "
            f"if the way were clear.{warn}\n"
            f"Map (P = you, S = start, C = cliff, G = goal):\n{_grid_lines(rows, (r, c))}"
        )

    def potential(self, obs: Any, env: Any) -> float | None:
        """Minus the grid distance to the goal (bottom right), as a share of the farthest cell's."""
        nrow, ncol = env.unwrapped.shape
        r, c = divmod(int(obs), ncol)
        return -_share(abs(nrow - 1 - r) + abs(ncol - 1 - c), nrow, ncol, (nrow - 1, ncol - 1))

    def outcome(self, action: str, reward: float, terminated: bool, truncated: bool, obs: Any, env: Any) -> str:
        if terminated:
            return f"You moved {action} and reached the goal! (reward {reward:g})"
        fell = " You fell off the cliff and are back at the start." if reward <= -100 else ""
        return self.step_report(f"You moved {action}", reward, fell, truncated, obs, env)


#: game name (gymnasium id without its version) -> formatter class
FORMATS: dict[str, type[GameFormat]] = {
    "FrozenLake": FrozenLakeFormat,
    "FrozenLake8x8": FrozenLakeFormat,
    "Taxi": TaxiFormat,
    "Blackjack": BlackjackFormat,
    "CliffWalking": CliffWalkingFormat,
}
