"""A griffe extension for the API pages: doctests written in a docstring's text become ```pycon code blocks.

Google-style parsing (griffe) turns `>>>` lines into code only inside an `Examples:` section; this project's
docstrings put their doctests in the text (TRL's `data_utils.py` does the same), where Markdown would read `>>>` as
a block quote and `[[1.0]]` as a link. The source is left as it is: pytest runs these doctests.
"""

from griffe import Extension, Object


def fence_doctests(text: str) -> str:
    """Wrap each run of doctest lines (`>>>`, `...`, their output; up to a blank line) in a fence, at its indent."""
    out, in_fence, indent = [], False, None
    for line in text.splitlines():
        stripped = line.lstrip()
        if indent is None and stripped.startswith("```"):
            in_fence = not in_fence
        if not in_fence and indent is None and stripped.startswith(">>>"):
            indent = line[: len(line) - len(stripped)]
            out.append(indent + "```pycon")
        elif indent is not None and not stripped:
            out.append(indent + "```")
            indent = None
        out.append(line)
    if indent is not None:
        out.append(indent + "```")
    return "\n".join(out)


class DoctestFences(Extension):
    def on_object(self, *, obj: Object, **kwargs) -> None:
        if obj.docstring is not None:
            obj.docstring.value = fence_doctests(obj.docstring.value)
