"""Byte vocabulary from the sample's train split, and markup cleaning."""

from __future__ import annotations

import json

import numpy as np
import pytest

from repgeom.data import enwik8
from repgeom.data.clean import strip_markup
from repgeom.data.vocab import MASK, UNK, Vocab


@pytest.fixture(scope="module")
def train_bytes() -> bytes:
    data, _ = enwik8.load_raw("sample")
    return enwik8.split(data)[0]


def test_vocab_is_the_sorted_train_bytes_plus_specials(train_bytes: bytes) -> None:
    v = Vocab.from_bytes(train_bytes)
    assert v.byte_values == tuple(sorted(set(train_bytes)))  # independent computation
    assert v.size == len(set(train_bytes)) + 2 == len(v)
    assert v.mask_id in v.special_ids and v.unk_id in v.special_ids
    assert v.decode([v.mask_id, v.unk_id]) == (MASK + UNK).encode()
    assert v.dtype == np.uint8


def test_encode_decode_round_trip(train_bytes: bytes) -> None:
    v = Vocab.from_bytes(train_bytes)
    ids = v.encode(train_bytes)
    assert ids.dtype == np.uint8 and ids.shape == (len(train_bytes),)
    assert ids.max() < len(v.byte_values)  # no special in text seen by the vocabulary
    assert v.decode(ids) == train_bytes
    # ids follow byte order: a sorted vocabulary keeps the byte order of the text
    raw = np.frombuffer(train_bytes[:1000], np.uint8)
    assert np.array_equal(np.argsort(ids[:1000], kind="stable"), np.argsort(raw, kind="stable"))


def test_unseen_bytes_map_to_unk() -> None:
    v = Vocab.from_bytes(b"abc")
    assert v.encode(b"a\xffc").tolist() == [0, v.unk_id, 2]
    with pytest.raises(ValueError, match="out of range"):
        v.decode([v.size])


def test_to_dict_from_dict_round_trip(train_bytes: bytes) -> None:
    v = Vocab.from_bytes(train_bytes)
    d = json.loads(json.dumps(v.to_dict()))  # survives JSON (and so any checkpoint format)
    w = Vocab.from_dict(d)
    assert w == v and w.mask_id == v.mask_id and w.size == v.size
    assert np.array_equal(w.encode(train_bytes[:5000]), v.encode(train_bytes[:5000]))
    with pytest.raises(ValueError, match="specials"):
        Vocab.from_dict({**d, "specials": ["[MASK]"]})


def test_more_than_256_symbols_use_uint16() -> None:
    v = Vocab(range(256))
    assert v.size == 258 and v.dtype == np.uint16
    assert v.decode(v.encode(bytes(range(256)))) == bytes(range(256))


def test_strip_markup() -> None:
    text = (
        b'<page><title>X</title><text xml:space="preserve">'
        b"{{Infobox|a={{nested|b}}}}Paris is the [[capital city|capital]] of [[France]]."
        b"&lt;ref&gt;A &amp; B&lt;/ref&gt; [[Image:x.png|thumb|A [[map]] here]]</text></page>"
    )
    assert strip_markup(text) == b"XParis is the capital of France.A & B A map here"


def test_clean_sample_has_no_markup(train_bytes: bytes) -> None:
    head = train_bytes[: train_bytes.index(b"</page>", 200_000) + len(b"</page>")]
    cleaned = strip_markup(head)
    assert len(cleaned) < 0.9 * len(head)
    assert b"<page>" not in cleaned and b"{{" not in cleaned
    # Real pages hold a few malformed bits (an unclosed "[[", a literal "IQ&amp;lt;80" in the
    # text): those stay, the rest of the markup goes.
    for marker in (b"[[", b"&lt;"):
        assert cleaned.count(marker) <= 0.05 * head.count(marker)
