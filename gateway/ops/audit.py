"""Audit log of guard decisions: one JSON object per line.

Each guarded request leaves one line per decision: ``intervened`` (a safety cut, prompt or response
gate), ``guard_error`` (the guard failed and the policy failed closed), ``fail_open`` (the guard failed and
the policy let the text through unscored), or ``pass`` (guarded, not cut). A request that switched the
guard off (a permission the operator grants) leaves a ``guard_disabled`` line, a refused override an
``override_refused`` line, and every line of a request that sent guard overrides carries them
(``guard_overrides``), so each loosening attempt and each tightening is on record.
Lines carry ids, the tenant, the category, the score, the threshold, the offsets and the SAE feature
ids; never the text unless ``ops.audit.include_content`` is on.

Lines are written by one background thread, never on the event loop: a slow or stalled disk must not hold
up every stream. Each line is one ``write()`` on a file opened in append mode, so several worker processes
can share the file without interleaving lines (lines stay well under the size POSIX appends keep whole).
The file is rotated by size (``ops.audit.max_bytes``, ``ops.audit.backups``) by the stdlib's rotating
handler. Rotation is per process: with several processes on one file, no line is lost, but a backup may
hold spans of several rotations; give each process its own path where that matters. Shutting the app
down writes every line already handed over before the file is closed.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import logging.handlers
import os
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from gateway.ops.config import AuditSettings
from gateway.serving.common import StreamStats
from guard.api import SafetyCut

log = logging.getLogger(__name__)


class AuditLog:
    def __init__(self, settings: AuditSettings, home: Path) -> None:
        self.settings = settings
        self.path: Path | None
        if settings.path is not None and str(settings.path) == "-":
            self.path = None
        else:
            self.path = settings.path or home / "audit" / "audit.jsonl"
        self._handler: logging.Handler | None = None
        self._writer: concurrent.futures.ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self.lines_written = 0

    def _open(self) -> logging.Handler:
        # only ever called on the writer thread
        if self._handler is None:
            if self.path is None:
                self._handler = logging.StreamHandler(sys.stderr)
            else:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._handler = logging.handlers.RotatingFileHandler(
                    self.path, maxBytes=self.settings.max_bytes, backupCount=self.settings.backups,
                    encoding="utf-8", delay=True,
                )
            # the handler's own error path prints to stderr and carries on; ours says which file, in our log
            self._handler.handleError = self._failed  # type: ignore[method-assign]
        return self._handler

    def _failed(self, record: logging.LogRecord) -> None:
        log.error("could not write the audit log at %s", self.path, exc_info=sys.exc_info())

    def _write_lines(self, lines: list[str]) -> None:
        try:
            handler = self._open()
        except OSError:
            # An unwritable audit log must not take the stream down; it is loud in the server log instead.
            log.exception("could not open the audit log at %s", self.path)
            return
        for line in lines:
            # one record per line: the handler checks the size and rolls over between lines, never inside one
            handler.emit(logging.LogRecord("audit", logging.INFO, "", 0, line, None, None))
            self.lines_written += 1

    def write(self, records: Iterable[dict[str, Any]]) -> concurrent.futures.Future[None]:
        """Hand the lines to the writer thread; the future is done once they are in the file."""
        lines = [json.dumps(rec, separators=(",", ":"), ensure_ascii=False) for rec in records]
        with self._lock:
            if self._writer is None:
                # one thread keeps the lines in order; reopened after close (a restarted lifespan serves again)
                self._writer = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="audit-writer")
            return self._writer.submit(self._write_lines, lines)

    def close(self) -> None:
        """Write every line handed over so far, then close the file. Blocks until done."""
        with self._lock:
            writer, self._writer = self._writer, None
        if writer is not None:
            writer.shutdown(wait=True)
        if self._handler is not None:
            self._handler.close()
            self._handler = None

    # ------------------------------------------------------------------------------- record building
    @staticmethod
    def cut_record(cut: SafetyCut) -> dict[str, Any]:
        return {
            "gate": cut.gate,
            "decision": cut.decision,
            "category": cut.category,
            "score": round(float(cut.score), 6),
            "threshold": round(float(cut.threshold), 6),
            "token_offset": cut.token_offset,
            "char_offset": cut.char_offset,
            "feature_ids": [f.id for f in cut.features],
            "trigger": cut.trigger,
        }

    def records(
        self,
        *,
        request_id: str | None,
        tenant: str,
        key_id: str | None,
        route: str,
        status: int,
        stats: list[StreamStats],
        prompt_cut: dict[str, Any] | None,
        guarded: bool,
        fail_closed: bool,
        content: dict[str, Any] | None,
        overrides: dict[str, Any] | None = None,
        guard_disabled: bool = False,
        override_refused: str | None = None,
    ) -> list[dict[str, Any]]:
        base: dict[str, Any] = {
            "ts": round(time.time(), 3),
            "request_id": request_id,
            "tenant": tenant,
            "key_id": key_id,
            "route": route,
            "status": status,
            "fail_closed": fail_closed,
            "pid": os.getpid(),
        }
        if overrides:
            base["guard_overrides"] = overrides
        out: list[dict[str, Any]] = []
        if override_refused is not None:
            out.append({**base, "gate": None, "decision": "override_refused", "param": override_refused})
        if prompt_cut is not None:
            out.append({**base, "model": prompt_cut.pop("_model", None), **prompt_cut})
        for st in stats:
            for cut in st.cuts:
                out.append({**base, "model": st.model, **self.cut_record(cut), "disconnected": st.disconnected})
            for f in st.guard_fail_open:
                out.append({**base, "model": st.model, "gate": f.gate, "decision": "fail_open", "category": None,
                            "token_offset": f.token_offset, "error": f.error, "disconnected": st.disconnected})
            if guard_disabled:
                out.append({**base, "model": st.model, "gate": None, "decision": "guard_disabled",
                            "completion_tokens": st.completion_tokens, "finish_reasons": st.finish_reasons,
                            "disconnected": st.disconnected})
            # a pass under overrides is logged even without log_passes: every override leaves a line
            if guarded and not st.cuts and not st.guard_fail_open and (self.settings.log_passes or overrides):
                out.append({**base, "model": st.model, "gate": "response", "decision": "pass",
                            "completion_tokens": st.completion_tokens, "finish_reasons": st.finish_reasons,
                            "disconnected": st.disconnected})
        if content is not None and self.settings.include_content:
            for rec in out:
                rec["content"] = content
        return out


def prompt_cut_from_error(body: bytes, model: str | None) -> dict[str, Any] | None:
    """The prompt gate answers 400 ``content_filter`` with the cut in ``error.safety``; read it back."""
    try:
        err = json.loads(body)["error"]
    except (ValueError, KeyError, TypeError):
        return None
    if not isinstance(err, dict) or err.get("code") != "content_filter" or not isinstance(err.get("safety"), dict):
        return None
    s = err["safety"]
    return {
        "_model": model,
        "gate": s.get("gate", "prompt"),
        "decision": s.get("decision", "intervened"),
        "category": s.get("category"),
        "score": s.get("score"),
        "threshold": s.get("threshold"),
        "token_offset": s.get("token_offset"),
        "char_offset": s.get("char_offset"),
        "feature_ids": [f.get("id") for f in s.get("features", []) if isinstance(f, dict)],
    }


def released_text(body: bytes, streamed: bool) -> list[str]:
    """The text each choice actually received (for ``include_content``), read back from our own response."""
    texts: dict[int, str] = {}
    try:
        if streamed:
            for frame in body.split(b"\n\n"):
                if not frame.startswith(b"data: {"):
                    continue
                obj = json.loads(frame[6:])
                for ch in obj.get("choices") or []:
                    piece = (ch.get("delta") or {}).get("content") if "delta" in ch else ch.get("text")
                    if piece:
                        texts[ch["index"]] = texts.get(ch["index"], "") + piece
        else:
            obj = json.loads(body)
            for ch in obj.get("choices") or []:
                piece = (ch.get("message") or {}).get("content") if "message" in ch else ch.get("text")
                texts[ch["index"]] = piece or ""
    except (ValueError, KeyError, TypeError):
        return []
    return [texts[i] for i in sorted(texts)]
