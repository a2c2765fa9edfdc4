from __future__ import annotations

from fastapi import APIRouter

from gateway.deps import EngineDep
from gateway.errors import not_found, not_ready
from gateway.protocol import ModelList, ModelObject
from inference.types import ModelCard

router = APIRouter(tags=["models"])


def _obj(card: ModelCard) -> ModelObject:
    return ModelObject(id=card.id, created=card.created, owned_by=card.owned_by, root=card.root, max_model_len=card.max_model_len)


@router.get("/v1/models", response_model=ModelList)
async def list_models(engine: EngineDep) -> ModelList:
    """List the served model."""
    if engine is None:
        raise not_ready()
    return ModelList(data=[_obj(engine.model_card)])


@router.get("/v1/models/{model_id:path}", response_model=ModelObject)
async def get_model(model_id: str, engine: EngineDep) -> ModelObject:
    """Retrieve one model."""
    if engine is None:
        raise not_ready()
    if model_id != engine.model_card.id:
        raise not_found(f"The model '{model_id}' does not exist", param="model", code="model_not_found")
    return _obj(engine.model_card)
