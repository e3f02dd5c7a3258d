"""Model completions as code: fences, prose, unfinished definitions; parsing helpers.

Used by the coding rewards (:mod:`comlrl_lightning.coding.reward`) to clean a completion the way a
user expects before it is tested. :func:`guarded` runs any of this on any text without raising
(deep nesting, 100k characters, NUL bytes, invalid UTF-8, huge literals give an error reason).
"""

from __future__ import annotations

import ast
import re
import threading

_START = re.compile(r"(async\s+def|def|class|import|from|@)\b")
_TOP_OK = re.compile(
    r"(async\s+def|def|class|import|from|@)\b|#(?!\s*(test|example|usage|check))|[\)\]\}]", re.I
)
_ASSIGN = re.compile(r"[A-Za-z_][\w.]*(\s*,\s*[A-Za-z_]\w*)*\s*(:[^=]+)?=(?!=)")


def strip_fences(text: str) -> str:
    """The code of a markdown answer: the first ```python block with a ``def`` (else the first
    block); an unterminated fence runs to the end; text without fences is returned as is."""
    blocks = _fenced_blocks(text)
    if not blocks:
        return text
    python = [body for lang, body in blocks if lang.lower() in ("", "python", "py", "python3")]
    cands = python or [body for _, body in blocks]
    with_def = [b for b in cands if re.search(r"^[ \t]*(async[ \t]+)?def\s", b, re.M)]
    return (with_def or cands)[0]


def _fenced_blocks(text: str) -> list[tuple[str, str]]:
    """``(language, body)`` of each markdown code block. A fence with a language always opens a
    block (so a stray empty ```` ``` ```` pair before it cannot swallow the code); a bare fence closes
    an open block, else opens one; an unterminated block runs to the end."""
    blocks: list[tuple[str, str]] = []
    body: list[str] | None = None
    lang = ""
    for line in text.split("\n"):
        fence = _FENCE_LINE.match(line)
        if fence is None:
            if body is not None:
                body.append(line)
            continue
        if body is not None and not fence.group(1):
            blocks.append((lang, "\n".join(body)))
            body = None
            continue
        if body is not None and any(b.strip() for b in body):
            blocks.append((lang, "\n".join(body)))
        body, lang = [], fence.group(1)
    if body is not None and any(b.strip() for b in body):
        blocks.append((lang, "\n".join(body)))
    return [(lg, b) for lg, b in blocks if b.strip()]


_FENCE_LINE = re.compile(r"\s*```\s*([\w+.-]*)")


def clean_completion(text: str) -> str:
    """Extract the code from a model completion.

    Strips markdown fences (:func:`strip_fences`), drops prose before the first line starting a
    ``def``/``class``/``import``/``from``/``@``, and keeps only definitions: imports, functions,
    classes, and assignments (after the first ``def`` only those without a call, e.g. constants,
    not ``result = f(3)``). Example calls, ``print``s, asserts and ``if __name__ == "__main__":``
    blocks are dropped; prose after the code ends it; a last definition cut off by
    ``max_new_tokens`` is dropped if it repeats a name defined before it. A completion with no such line
    (a bare function body) is returned with its indentation kept.
    """
    code = strip_fences(text).replace("\r\n", "\n")
    lines = code.split("\n")
    start = next((i for i, line in enumerate(lines) if _START.match(line)), None)
    if start is None:
        return code.strip("\n").rstrip()
    code = "\n".join(lines[start:])
    tree = parse_code(code)
    if tree is None:  # trailing prose or test lines break parsing: cut at the first one
        code = _cut_at_prose(lines[start:])
        tree = parse_code(code)
    if tree is None:  # cut off by max_new_tokens: drop the unfinished last top-level block(s)
        code = _drop_unfinished_tail(code)
        tree = parse_code(code)
        if tree is None:
            return code
    src, keep, seen_def = code.split("\n"), [], False
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            seen_def = True
        elif not isinstance(node, (ast.Import, ast.ImportFrom)) and not (
            isinstance(node, (ast.Assign, ast.AnnAssign))
            and (not seen_def or not any(isinstance(n, ast.Call) for n in ast.walk(node)))
        ):
            continue  # example calls, prints, asserts, `if __name__ == "__main__":` ...
        first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        keep.append("\n".join(src[first - 1 : node.end_lineno]))
    return "\n\n".join(keep).strip("\n")


def _drop_unfinished_tail(code: str) -> str:
    """The longest prefix of whole top-level blocks that parses and still defines every function
    name the code defines (so only a repeated, unfinished definition is dropped; a broken sole
    definition stays and fails the syntax level). ``code`` itself if there is none. Only the last
    :data:`MAX_TAIL_CUTS` block starts are tried (a hard budget: one parse each, so the cost is
    linear in ``len(code)`` however many top-level lines the text has)."""
    lines = code.split("\n")
    names = set(_DEF_NAME.findall(code))
    starts = [i for i, line in enumerate(lines) if line.strip() and line[0] not in " \t#)]}"]
    for cut in reversed(starts[1:][-MAX_TAIL_CUTS:]):
        prefix = "\n".join(lines[:cut]).rstrip()
        if set(_DEF_NAME.findall(prefix)) >= names and parse_code(prefix) is not None:
            return prefix
    return code


MAX_TAIL_CUTS = 4
"""How many cut points :func:`_drop_unfinished_tail` tries, from the end (``max_new_tokens``
cuts off the last one or two blocks)."""
_DEF_NAME = re.compile(r"^(?:async\s+)?def\s+([A-Za-z_]\w*)", re.M)


def _cut_at_prose(lines: list[str]) -> str:
    out, seen_def = [], False
    for line in lines:
        if line.strip() and line[0] not in " \t":
            if _TOP_OK.match(line):
                seen_def = seen_def or bool(re.match(r"(async\s+)?def\b|class\b", line))
            elif seen_def or not _ASSIGN.match(line):
                break
        out.append(line)
    return "\n".join(out).rstrip()


def compiles(code: str) -> bool:
    """Whether ``code`` compiles (stricter than parsing: e.g. ``return`` outside a function)."""
    try:
        compile(code, "<candidate>", "exec", dont_inherit=True)
        return True
    except (SyntaxError, ValueError):
        return False


def parse_code(code: str) -> ast.Module | None:
    """``ast.parse(code)``, or ``None`` if it does not parse. Texts that failed are remembered
    (the last :data:`_FAILED_SIZE`), so the cleaning and static passes parse a broken completion
    a bounded number of times (each parse is linear in its length)."""
    if code in _failed:
        return None
    try:
        return ast.parse(code)
    except (SyntaxError, ValueError):
        with _failed_lock:
            _failed[code] = None
            while len(_failed) > _FAILED_SIZE:
                _failed.pop(next(iter(_failed)))
        return None


_FAILED_SIZE = 64
_failed: dict[str, None] = {}
_failed_lock = threading.Lock()


def find_function(code: str, name: str) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    """The last top-level ``def name`` in ``code`` (``None`` if absent or unparseable)."""
    tree = parse_code(code)
    found = None
    for node in tree.body if tree else []:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            found = node
    return found


def defines(code: str, name: str) -> bool:
    """Whether ``code`` defines function ``name`` at top level (textual check if it does not parse)."""
    if parse_code(code) is not None:
        return find_function(code, name) is not None
    return re.search(rf"^(async\s+)?def\s+{re.escape(name)}\s*\(", code, re.M) is not None


def textual_return(code: str, name: str) -> bool:
    """Whether a line after the first ``def name(`` line is an indented ``return`` (for code that
    does not parse; one pass over the lines, linear in ``len(code)``)."""
    lines = code.split("\n")
    start = next(
        (i for i, line in enumerate(lines) if re.match(rf"def\s+{re.escape(name)}\s*\(", line)), None
    )
    return start is not None and any(_RETURN.match(line) for line in lines[start + 1 :])


_RETURN = re.compile(r"[ \t]+return\b")


def prompt_preamble(prompt: str, entry_point: str) -> str:
    """The problem prompt without the entry point's stub: imports and helper definitions (e.g.
    ``poly`` in HumanEval/32) that the tests and the solution may need."""
    tree = parse_code(prompt)
    if tree is None:
        return "\n".join(line for line in prompt.splitlines() if re.match(r"(import|from)\s", line))
    funcs = (ast.FunctionDef, ast.AsyncFunctionDef)
    keep = [n for n in tree.body if not (isinstance(n, funcs) and n.name == entry_point)]
    return "\n\n".join(ast.get_source_segment(prompt, n) or ast.unparse(n) for n in keep)


MAX_COMPLETION_CHARS = 20_000
"""Completions longer than this (characters) are not parsed: score 0, reason ``too_long``
(a 512-token completion is ~2,000 characters)."""
MAX_LAMBDAS = 100
"""Completions with more ``lambda`` words than this are not parsed: score 0, reason
``too_nested``. Nested ``lambda: lambda: ...`` chains are the one scope nesting the parser does
not bound (parentheses stop at 200 levels, indentation at 100), and ``compile()`` and the static
passes are super-linear in it (3-16 s for one 20,000-character chain); a count is linear."""
ERROR_REASONS = ("too_long", "nul_byte", "invalid_text", "too_nested", "recursion", "memory", "value")
"""Why a completion could not be analysed; each is logged as ``rewards/<name>/error_<reason>``."""


def guarded(fn, *args):
    """``(fn(*args), None)``, or ``(None, reason)`` when the text breaks the analysis (never raises
    for any ``str``); ``reason`` is one of :data:`ERROR_REASONS`."""
    for text in args:
        if isinstance(text, str):
            if len(text) > MAX_COMPLETION_CHARS:
                return None, "too_long"
            if "\x00" in text:
                return None, "nul_byte"
            if text.count("lambda") > MAX_LAMBDAS:
                return None, "too_nested"
            try:
                text.encode("utf-8")
            except UnicodeError:
                return None, "invalid_text"
    try:
        return fn(*args), None
    except RecursionError:
        return None, "recursion"
    except MemoryError:
        return None, "memory"
    except (ValueError, SyntaxError, OverflowError, TypeError, UnicodeError):
        return None, "value"


def _bound_names(node: ast.stmt) -> set[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in node.names}
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}


def without_definitions_of(code: str, names: set[str]) -> tuple[str, bool]:
    """``code`` without its top-level statements that bind any of ``names``; whether any was dropped."""
    tree = parse_code(code)
    if tree is None:
        return code, False
    keep = [n for n in tree.body if not (_bound_names(n) & names)]
    if len(keep) == len(tree.body):
        return code, False
    return "\n\n".join(ast.get_source_segment(code, n) or ast.unparse(n) for n in keep), True
