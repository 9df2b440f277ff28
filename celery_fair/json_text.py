"""kombu's JSON, written faster: one encoder kept instead of one made per call, and the
JSON of a bulk hold's messages written once per call and filled in per message
(``bulk_messages.py``'s quick way).

kombu's ``dumps`` is ``json.dumps(obj, cls=JSONEncoder)`` (kombu's encoder): a new
encoder per call, then its ``encode``. One encoder kept (:data:`ENCODER`) writes the
same text (an encoder keeps no state between calls), and since the text of a mapping or
a sequence is its members' texts joined in order, a message's headers and properties
are the template's text with the JSON of the few values that differ put in their places
(:func:`json_format`), and its body ``[args, kwargs, embed]`` the JSON of ``[args,
kwargs]`` with the template's ``embed`` after it (:func:`body_tail`). Where kombu would
not serialize with its own JSON (another serializer, a compression, a ``dumps`` of the
app's own), :func:`body_tail` says so and every message is serialized by the producer.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from json.encoder import encode_basestring_ascii
from typing import Any

from kombu.serialization import registry
from kombu.utils import json as kombu_json

#: One kombu encoder for every message: the text of kombu's ``dumps``.
ENCODER = kombu_json.JSONEncoder()

#: The JSON of a text, as the encoder writes it (``ensure_ascii``, its C function).
quoted = encode_basestring_ascii


def json_format(mapping: Mapping[str, Any], fields: Mapping[str, int]) -> str:
    """kombu's JSON of ``mapping`` as a ``str.format`` text where the value of each key
    in ``fields`` is the positional field numbered there (a key missing from ``mapping``
    is added last, as ``{**mapping, key: value}`` adds it).

    Raises:
        ValueError: the text cannot be split so (a mark found more than once).
    """
    marks = {key: f"celery-fair-{uuid.uuid4().hex}" for key in fields}
    text = ENCODER.encode({**mapping, **marks}).replace("{", "{{").replace("}", "}}")
    for key, mark in marks.items():
        spot = quoted(mark)
        if text.count(spot) != 1:
            raise ValueError(f"header {key!r}: its mark is not found once")
        text = text.replace(spot, f"{{{fields[key]}}}")
    return text


def body_tail(producer: Any, prepare: tuple[Any, ...], embed: Any) -> str | None:
    """What follows the JSON of ``[args, kwargs]`` (but its ``]``) in the message body
    kombu's ``_prepare`` makes with ``prepare`` (serializer, content type, content
    encoding, compression): ``, <embed JSON>]``; None when it would not make it with
    kombu's own JSON, uncompressed."""
    serializer, content_type, _, compression = prepare
    codec = registry._encoders.get(serializer or producer.serializer)
    if content_type or compression or codec is None \
            or codec.encoder is not kombu_json.dumps or codec.content_encoding != "utf-8":
        return None
    return f", {ENCODER.encode(embed)}]"
