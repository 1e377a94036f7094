"""A client of Corral's HTTP API (its OpenAPI document is GET /api/openapi.json).

    async with AsyncClient() as corral:          # $CORRAL_URL, $CORRAL_API_TOKEN
        t = await corral.spawn("say hi", command=["echo", "hi"])
        res = await corral.result(t["task_id"], wait=60)
"""

from . import types
from ._client import DEFAULT_URL, AsyncClient, Client, chunk_bytes
from .errors import CorralError

__all__ = ["AsyncClient", "Client", "CorralError", "DEFAULT_URL", "chunk_bytes", "types"]
