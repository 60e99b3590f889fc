"""ms-swift compatibility: what a scheduler written for ms-swift imports, under ms-swift's names.

:mod:`.adapter`: the base classes (``RolloutScheduler``, ``MultiTurnScheduler``) that adapt an
ms-swift scheduler to rlcore's scheduler contract; :mod:`.api`: 3.x's (``swift.plugin.multi_turn``,
``swift.llm``) response types and helpers; :mod:`.v4`: 4.x's (``swift.rollout.multi_turn``) helper
methods. ``from rlcore import MultiTurnScheduler`` is this package's class.
"""

from .api import (
    ChatCompletionResponse,
    Messages,
    ResponseChoice,
    RolloutOutput,
    extract_logprobs,
    extract_logprobs_from_choice,
    get_token_backed_response_ids,
    invoke_async_hook,
    remove_response,
)
from .adapter import MultiTurnScheduler, RolloutScheduler
from .v4 import SwiftHelpers

__all__ = [
    "ChatCompletionResponse",
    "Messages",
    "MultiTurnScheduler",
    "ResponseChoice",
    "RolloutOutput",
    "RolloutScheduler",
    "SwiftHelpers",
    "extract_logprobs",
    "extract_logprobs_from_choice",
    "get_token_backed_response_ids",
    "invoke_async_hook",
    "remove_response",
]
