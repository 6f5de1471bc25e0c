"""DRF parsers that hold every body to the input rules of apps.core.inputs (the defaults in settings)."""

from __future__ import annotations

from typing import IO, Any

from django.conf import settings
from rest_framework import parsers
from rest_framework.exceptions import ParseError

from apps.core.errors import ValidationFailed
from apps.core.inputs import InputProblem, field_path, json_loads_strict, text_problem


class JSONParser(parsers.JSONParser):
    """JSON, strictly: no NaN or out-of-range numbers, no NUL or lone surrogate, bounded nesting.

    A value that breaks a rule is a 400 naming its path (``plan.task_names[0]``), not a 500
    when PostgreSQL or the UTF-8 encoder meets it later.
    """

    def parse(self, stream: IO[bytes] | None, media_type: str | None = None, parser_context: Any = None) -> Any:
        encoding = (parser_context or {}).get("encoding", settings.DEFAULT_CHARSET)
        raw = stream.read() if stream is not None else b""
        try:
            return json_loads_strict(raw.decode(encoding))
        except (UnicodeDecodeError, LookupError) as exc:
            raise ParseError(f"JSON parse error - the body is not valid {encoding} text ({exc})") from None
        except InputProblem as exc:
            if exc.path is None:
                raise ParseError(f"JSON parse error - {exc.message}") from None
            field = field_path(exc.path)
            raise ValidationFailed(f"{field}: {exc.message}" if field else exc.message, field=field) from None


class MultiPartParser(parsers.MultiPartParser):
    """Form uploads with the same text rule for field names, values and file names."""

    def parse(self, stream: IO[bytes], media_type: str | None = None, parser_context: Any = None) -> Any:
        parsed = super().parse(stream, media_type, parser_context)
        for key, values in [*parsed.data.lists(), *parsed.files.lists()]:
            texts = [key, *(v if isinstance(v, str) else (v.name or "") for v in values)]
            problem = next((p for p in map(text_problem, texts) if p), None)
            if problem:
                field = key if text_problem(key) is None else None
                raise ValidationFailed(f"{field or 'a form field name'}: the text {problem}", field=field)
        return parsed
