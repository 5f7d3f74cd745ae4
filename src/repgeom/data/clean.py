"""Optional markup stripping for enwik8 (``data.clean=true``; off by default).

Razzhigaev et al. (2024, "The Shape of Learning: Anisotropy and Intrinsic Dimensions in
Transformer-Based Models", EACL Findings) train on enwik8 with the markup removed. We remove:

- XML tags of the dump (``<page>``, ``<text xml:space="preserve">``, ...);
- HTML tags inside the wiki text, which the dump escapes (``&lt;ref&gt;`` → ``<ref>`` → removed);
  the other common entities (``&amp; &quot;``) are unescaped first;
- wiki templates ``{{...}}``, nested ones included (innermost first);
- link targets: ``[[target|text]]`` → ``text``, ``[[text]]`` → ``text``; for an image link with
  several ``|`` fields the last one (the caption) is kept.

Text between the tags (including ids and timestamps of the dump's metadata) is kept. The split
is made on the raw bytes first, so a split boundary never moves when cleaning is switched on.
"""

from __future__ import annotations

import re

_XML_TAG = re.compile(rb"<[^<>]*>")
_TEMPLATE = re.compile(rb"\{\{[^{}]*\}\}")
_LINK = re.compile(rb"\[\[(?:[^\[\]|]*\|)*([^\[\]|]*)\]\]")
_ENTITIES = ((b"&lt;", b"<"), (b"&gt;", b">"), (b"&quot;", b'"'), (b"&nbsp;", b" "))


def _until_stable(pattern: re.Pattern, repl: bytes, data: bytes) -> bytes:
    # Nested constructs ({{a {{b}} c}}, [[File:x|a [[b]] c]]) vanish innermost first.
    while True:
        data, n = pattern.subn(repl, data)
        if n == 0:
            return data


def strip_markup(data: bytes) -> bytes:
    """``data`` without XML/HTML tags, wiki templates and link targets (see module docstring).

    >>> strip_markup(b"<text>A {{cite|x}}[[Paris|city]] and [[Rome]] &lt;br/&gt;.</text>")
    b'A city and Rome .'
    """
    data = _XML_TAG.sub(b"", data)
    for entity, char in _ENTITIES:
        data = data.replace(entity, char)
    data = data.replace(b"&amp;", b"&")  # last, so "&amp;lt;" stays the literal text "&lt;"
    data = _XML_TAG.sub(b"", data)
    data = _until_stable(_TEMPLATE, b"", data)
    return _until_stable(_LINK, rb"\1", data)
