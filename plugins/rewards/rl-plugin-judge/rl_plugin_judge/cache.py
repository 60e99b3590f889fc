"""Verdicts already paid for: a judge is asked once per (judge, rendered rubric) — which holds the
prompt and the completion — however many samples of a group, or steps of a run, produce it.

In memory always; with ``cache_path`` also an append-only JSONL file (one ``{"key", "score",
"reply"}`` object a line) read back when the reward is built, so a resumed or repeated run asks
again only for what it has not seen. Only scores are kept: a failed call or an unparseable reply
is asked again next time. A line cut short by a crash is skipped on reading (and said, once); a
file that cannot be written any more (full disk) leaves the verdicts in memory and says so once.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any

from rlcore.errors import ConfigError

logger = logging.getLogger(__name__)


def cache_key(judge: str, messages: list[dict[str, Any]]) -> str:
    """A stable key for asking ``judge`` (its URL + model, or its path) these messages."""
    blob = json.dumps([judge, messages], ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


class VerdictCache:
    """key -> (score in [0, 1], the judge's reply)."""

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.entries: dict[str, tuple[float, str]] = {}
        self.path = Path(path).expanduser() if path else None
        self._write_failed = False
        if self.path is not None:
            if self.path.is_dir():
                raise ConfigError(f"llm_judge: cache_path {self.path} is a directory; give a file name (verdicts.jsonl)")
            self._load()

    def __len__(self) -> int:
        return len(self.entries)

    def get(self, key: str) -> tuple[float, str] | None:
        return self.entries.get(key)

    def _load(self) -> None:
        assert self.path is not None
        if not self.path.exists():
            return
        bad = 0
        with self.path.open(encoding="utf-8", errors="replace") as f:
            for line in f:
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                    self.entries[str(row["key"])] = (float(row["score"]), str(row.get("reply", "")))
                except (ValueError, KeyError, TypeError):
                    bad += 1
        if bad:
            logger.warning("llm_judge: skipped %d unreadable line(s) of the verdict cache %s (a write cut short?); "
                           "those verdicts are asked again", bad, self.path)

    def put_many(self, verdicts: dict[str, tuple[float, str]]) -> None:
        """Keep ``verdicts`` (and append them to the file, when there is one)."""
        new = {k: v for k, v in verdicts.items() if k not in self.entries}
        self.entries.update(new)
        if self.path is None or not new or self._write_failed:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a", encoding="utf-8") as f:
                f.write("".join(json.dumps({"key": k, "score": s, "reply": r}, ensure_ascii=False) + "\n"
                                for k, (s, r) in new.items()))
        except OSError as exc:
            self._write_failed = True
            logger.warning("llm_judge: cannot write the verdict cache %s (%s); verdicts stay in memory for this run",
                           self.path, exc)
