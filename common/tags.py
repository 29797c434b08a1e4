"""Find tagged blocks (`<answer>...</answer>`) in model output in linear time.

A regex such as `<answer>(.*?)</answer>` rescans the rest of the text from every unmatched opening tag, which is
quadratic on hostile output with many opening tags and no closing one. Plain `str.rfind`/`str.find` stay linear.
"""

from __future__ import annotations


def last_block(text: str, tag: str) -> str | None:
    """Content of the last `<tag>` that is closed, up to its first `</tag>`; None when there is no such block.

    "<answer>a</answer> </answer>" gives "a"; "<answer>a <answer>b</answer>" gives "b" (the innermost, latest block).
    """
    open_tag, close_tag = f"<{tag}>", f"</{tag}>"
    last_close = text.rfind(close_tag)
    if last_close < 0:
        return None
    start = text.rfind(open_tag, 0, last_close)
    if start < 0:
        return None
    start += len(open_tag)
    return text[start : text.find(close_tag, start)]
