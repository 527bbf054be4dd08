"""The results schema: one typed document, read and written by every report.

A run's results.json is a `ResultsDocument`: its `RunMeta` and the `CaseResult` rows
(harness/cases/declaration.py). JSON, JUnit system-out, HTML, compliance, merge and diff all work
on these structs; nothing else parses or builds a result row, so the readers and the
writers cannot drift apart. msgspec does the typing: a malformed file is one
`ResultsFileError` that says where, never a KeyError three modules later.

A case's result crosses from the case to the report exactly once as bytes: the plugin
encodes it where the case ends (`encode_result`; the bytes ride on the pytest report,
which xdist ships to the controller) and decodes it where the report is assembled
(`decode_result`).
"""

from __future__ import annotations

import json
from typing import Any

import msgspec

from harness.results.records import CaseResult
from harness.results.startup import Stop

UNSET = msgspec.UNSET


class ResultsFileError(ValueError):
    """A results document that does not match the schema (or is no JSON at all)."""


class MergedFrom(msgspec.Struct):
    """One input of `corewire merge`: its report dir and the shard it held."""

    dir: str
    shard: list[int]


PER_FRONTEND = "per frontend"  # protocol_profile / vllm_version of a mixed run


class RunMeta(msgspec.Struct):
    """The labels of one run. Field order is the key order in results.json; an UNSET
    field is absent from the file (a document written without run facts, or before
    they existed, reads and writes back as it was)."""

    generated: str | msgspec.UnsetType = UNSET
    protocol_profile: str | msgspec.UnsetType = UNSET
    vllm_version: str | msgspec.UnsetType = UNSET
    python: str | msgspec.UnsetType = UNSET
    host: str | msgspec.UnsetType = UNSET
    shard: list[int] | None | msgspec.UnsetType = UNSET  # [index, count]; None: unsharded
    selection: dict[str, Any] | None | msgspec.UnsetType = UNSET  # harness/run/shard.py
    failing: dict[str, str] | msgspec.UnsetType = UNSET  # "case[frontend]" -> why
    failed_outside_cases: int | msgspec.UnsetType = UNSET  # errors outside any case
    partial: bool | msgspec.UnsetType = UNSET  # the run stopped early (an interrupt)
    merged_from: list[MergedFrom] | msgspec.UnsetType = UNSET
    partial_reason: str | msgspec.UnsetType = UNSET
    stopped: list[Stop] | msgspec.UnsetType = UNSET  # frontends stopped (harness/run/failfast.py)
    # frontend -> the protocol profile its engines spoke, only when the frontends of the
    # run spoke different ones (vllm-rs@X beside vllm-rs); protocol_profile and
    # vllm_version then say PER_FRONTEND.
    frontend_profiles: dict[str, str] | msgspec.UnsetType = UNSET

    def profile_label(self) -> str:
        """'protocol profile P, vLLM V', or each frontend's when they differ."""
        if isinstance(self.frontend_profiles, dict):
            return "protocol profiles per frontend: " + ", ".join(
                f"{name} {profile}" for name, profile in self.frontend_profiles.items())
        return (f"protocol profile {self.label('protocol_profile')}, vLLM "
                f"{self.label('vllm_version')}")

    def label(self, name: str) -> str:
        """A label the renderers print; its absence is the file's fault, said so."""
        value = getattr(self, name)
        if value is UNSET:
            raise ResultsFileError(f"results document: meta.{name} is missing")
        return str(value)


class ResultsDocument(msgspec.Struct):
    """results.json: the run's meta and its rows, sorted by (case id, frontend)."""

    meta: RunMeta
    results: list[CaseResult]

    def frontends(self) -> list[str]:
        """The frontends of the run, sorted: the columns of every matrix view."""
        return sorted({r.frontend for r in self.results})

    def by_case(self) -> dict[str, dict[str, CaseResult]]:
        """case id -> frontend -> row: the rows of every matrix view, in document order."""
        table: dict[str, dict[str, CaseResult]] = {}
        for r in self.results:
            table.setdefault(r.case_id, {})[r.frontend] = r
        return table


class _Rows(msgspec.Struct):
    """What `corewire diff` needs of a document: the rows (any meta, even none)."""

    results: list[CaseResult]


_RESULT_DECODER = msgspec.json.Decoder(CaseResult)
_DOCUMENT_DECODER = msgspec.json.Decoder(ResultsDocument)
_ROWS_DECODER = msgspec.json.Decoder(_Rows)
_ENCODER = msgspec.json.Encoder()


def encode_result(result: CaseResult) -> bytes:
    """The one serialisation of a case's result on its way to the report."""
    return _ENCODER.encode(result)


def decode_result(data: bytes | str) -> CaseResult:
    """The one parse of a case's result where the report is assembled."""
    try:
        return _RESULT_DECODER.decode(data)
    except msgspec.DecodeError as exc:
        raise ResultsFileError(f"case result: {exc}") from None


def _file_error(where: str, exc: msgspec.DecodeError) -> ResultsFileError:
    """No JSON at all is `unreadable`; JSON of another shape is `not a corewire
    results.json`, with the path of the field that is wrong."""
    if isinstance(exc, msgspec.ValidationError):
        return ResultsFileError(f"{where}: not a corewire results.json ({exc})")
    return ResultsFileError(f"{where}: unreadable ({exc})")


def parse_document(data: bytes | str, where: str = "results document") -> ResultsDocument:
    try:
        return _DOCUMENT_DECODER.decode(data)
    except msgspec.DecodeError as exc:
        raise _file_error(where, exc) from None


def read_document(path: str) -> ResultsDocument:
    """A results.json file as its document (OSError if unreadable, ResultsFileError if
    malformed)."""
    with open(path, "rb") as fh:
        return parse_document(fh.read(), path)


def read_results(path: str) -> list[CaseResult]:
    """The rows of a results.json file, whatever its meta holds."""
    with open(path, "rb") as fh:
        data = fh.read()
    try:
        return _ROWS_DECODER.decode(data).results
    except msgspec.DecodeError as exc:
        raise _file_error(path, exc) from None


def document_json(doc: ResultsDocument) -> str:
    """results.json's text: indented one space, ASCII only, the format it has always
    had (so files written before the schema and after it compare byte for byte)."""
    return json.dumps(msgspec.to_builtins(doc), indent=1) + "\n"


def as_builtins(value: msgspec.Struct) -> Any:
    """A struct as plain dicts and lists under its JSON names (for tests and tools)."""
    return msgspec.to_builtins(value)
