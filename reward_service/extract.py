"""Getting the program out of a completion."""
from __future__ import annotations

import re

_FENCE = re.compile(r"```[ \t]*(?:python|py|python3)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL | re.IGNORECASE)


def extract_code(completion: str, prompt_is_code: bool) -> str:
    """The code of a completion.

    A completion that continues the prompt's code is code as it is. Otherwise the first fenced
    block is taken (an unterminated fence runs to the end), or the whole text when there is none.
    """
    if prompt_is_code:
        return completion
    match = _FENCE.search(completion)
    return match.group(1) if match else completion
