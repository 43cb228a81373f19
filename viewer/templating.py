"""The viewer's Jinja2 templates (viewer/templates), autoescaped; ``render`` adds the common context."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import HTMLResponse
from starlette.templating import Jinja2Templates

from schemas.config.serving import registry_version

TEMPLATES_DIR = Path(__file__).parent / "templates"
STATIC_DIR = Path(__file__).parent / "static"

templates = Jinja2Templates(directory=str(TEMPLATES_DIR))
templates.env.filters["registry_version"] = registry_version  # links: /versions/v0004, not served@v0004


def render(request: Request, template: str, context: dict[str, Any], status_code: int = 200) -> HTMLResponse:
    """One page: ``template`` with ``context`` (``request`` and the visitor's ``scope`` added)."""
    ctx = {"scope": getattr(request.state, "scope", None), **context}
    return templates.TemplateResponse(request, template, ctx, status_code=status_code)
