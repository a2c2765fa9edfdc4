"""``GET /playground``: a static browser page that drives the public API (chat streaming with per-token
risk, ``/v1/guard/score``, suite runs). No build step: the files under ``gateway/static/playground``
are served as they are, and the page talks to the gateway only through the documented endpoints."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse, RedirectResponse

from gateway.errors import not_found

STATIC_DIR = Path(__file__).resolve().parents[2] / "static" / "playground"

# Explicit types: module scripts must be served as JavaScript, and the platform's mimetypes table
# varies (some images map .js to text/plain, which browsers refuse for ES modules).
_MEDIA_TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml"}

# no-cache (revalidate, not "never store"): the page changes with the gateway version, and a stale
# app.js against a newer API would be a confusing failure.
_HEADERS = {"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"}

router = APIRouter(tags=["playground"], include_in_schema=False)


@router.api_route("/playground", methods=["GET", "HEAD"])
async def playground() -> FileResponse:
    return FileResponse(STATIC_DIR / "index.html", media_type="text/html", headers=_HEADERS)


@router.get("/playground/")
async def playground_slash() -> RedirectResponse:
    # The page uses relative asset URLs; one canonical address keeps them resolving to /playground/static.
    return RedirectResponse("../playground", status_code=308)


# An explicit route rather than ``router.mount(StaticFiles)``: FastAPI's include_router silently drops
# Mounts, so a mount here would vanish once the lead includes the router.
@router.api_route("/playground/static/{name:path}", methods=["GET", "HEAD"])
async def playground_static(name: str) -> FileResponse:
    root = STATIC_DIR.resolve()
    path = (root / name).resolve()
    media_type = _MEDIA_TYPES.get(path.suffix)
    # Only known file types, only inside the folder (resolve() folds "..", symlinks included).
    if media_type is None or not path.is_relative_to(root) or not path.is_file():
        raise not_found(f"No playground file '{name}'.")
    return FileResponse(path, media_type=media_type, headers=_HEADERS)
