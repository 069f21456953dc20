"""OpenAI-style error objects: {"error": {"message", "type", "param", "code"}}."""
from __future__ import annotations

from fastapi.responses import JSONResponse
from pydantic import BaseModel

TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
         404: "not_found_error", 409: "conflict_error", 413: "invalid_request_error",
         422: "invalid_request_error", 429: "rate_limit_error", 503: "service_unavailable"}


class APIError(Exception):
    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 headers: dict | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.headers = status, message, param, code, headers


def error_response(status: int, message: str, *, param: str | None = None, code: str | None = None,
                   headers: dict | None = None) -> JSONResponse:
    return JSONResponse(status_code=status, headers=headers,
                        content={"error": {"message": message, "type": TYPES.get(status, "server_error"),
                                           "param": param, "code": code}})


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorBody(BaseModel):
    error: ErrorDetail


# documented on every route (serving.app), so the OpenAPI schema says what an error looks
# like and schema-driven clients and fuzzers can check it
ERROR_RESPONSES = {
    400: {"model": ErrorBody, "description": "malformed or invalid request (the message names the field)"},
    401: {"model": ErrorBody, "description": "missing, unknown or revoked API key"},
    403: {"model": ErrorBody, "description": "this key's role may not use this endpoint"},
    404: {"model": ErrorBody, "description": "no such model, request or key"},
    409: {"model": ErrorBody, "description": "conflict with the current state"},
    413: {"model": ErrorBody, "description": "request body over max_body_bytes"},
    429: {"model": ErrorBody, "description": "shed, or over this key's rate or concurrency limit (see Retry-After)"},
    503: {"model": ErrorBody, "description": "the backend, predictor or database is unavailable"},
}
