"""Typed access to the objects the app holds (set up in ``gateway.main``)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from gateway.config import Settings
from gateway.serving.chat import ServingChat
from gateway.serving.completions import ServingCompletion
from inference.engine import EngineClient


def _settings(request: Request) -> Settings:
    return request.app.state.settings  # type: ignore[no-any-return]


def _engine(request: Request) -> EngineClient | None:
    return request.app.state.engine  # type: ignore[no-any-return]


def _chat(request: Request) -> ServingChat:
    return request.app.state.serving_chat  # type: ignore[no-any-return]


def _completion(request: Request) -> ServingCompletion:
    return request.app.state.serving_completion  # type: ignore[no-any-return]


SettingsDep = Annotated[Settings, Depends(_settings)]
EngineDep = Annotated[EngineClient | None, Depends(_engine)]
ChatDep = Annotated[ServingChat, Depends(_chat)]
CompletionDep = Annotated[ServingCompletion, Depends(_completion)]
