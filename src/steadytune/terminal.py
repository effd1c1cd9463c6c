"""Text that came from a file (a log's metric names, a file's own name) made safe to print.

A log is input anyone may have written: a CSV header ``train/loss\\x1b[2J\\x1b]0;T\\x07`` printed
as it is clears the operator's screen and sets the terminal's title, and a file name holding a
newline fakes a line of the report. Each control character (C0, DEL and C1, which holds the
8-bit CSI) and each Unicode line or paragraph separator is shown as its Python escape instead, so
it is seen, not obeyed.
"""

from __future__ import annotations

import re

# Every character that breaks a line for someone: C0 (LF, CR, VT, FF, the file/group/record
# separators), DEL, C1 (NEL U+0085, the 8-bit CSI) and the Unicode line and paragraph separators.
# str.splitlines() breaks at all of these, and so does the email package, which refuses a header
# holding one; a mail reader or an editor may show a new line at U+2028.
CONTROL_CHARS = "\x00-\x1f\x7f-\x9f\u2028\u2029"
_CONTROL = re.compile(f"[{CONTROL_CHARS}]")


def shown(text: str) -> str:
    """``text`` with each control character written as its escape (``\\x1b``, ``\\n``)."""
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], text)
