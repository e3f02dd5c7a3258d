"""The ``api`` comparator's HTTP client: standard-library ``urllib``, four wire formats, bounded
retries, and a key that lives only in the environment.

Formats (:data:`~comlrl_lightning.preference.comparator.config.COMPARATOR_API_FORMAT`; payloads and extraction as
CoMLRL 1.4.3 ``MADPOIterTrainer._build_*_payload`` / ``_extract_*_completions``):

- ``openai_chat``: ``{"model", "messages": [{"role": "user", "content": prompt}], "n", "max_tokens",
  "temperature", "top_p"}``; texts from ``choices[*].message.content`` (or ``choices[*].text``).
  ``n`` above ``comparator_api_max_n_per_request`` is split over several requests.
- ``generic``: ``{"prompt", "agent_idx", "num_return_sequences", "max_new_tokens", "temperature",
  "top_p", "top_k", "batch_item", "model"?}``; texts at ``comparator_api_response_field`` (else
  ``completions`` / ``responses`` / ``outputs`` / ``choices``), strings or ``{text|content|...}``.
- ``anthropic_messages`` / ``openai_responses``: one sample per request; texts from ``content[*]``
  blocks of type ``text`` / ``output[*].content[*]`` blocks of type ``output_text``.

Failures (:class:`ComparatorError`): a timeout, a refused or reset connection, HTTP 408, 429 and 5xx
are *retryable*: retried ``comparator_api_max_retries`` times, waiting ``backoff · 2^attempt`` seconds
(capped at 30 s), or the server's ``Retry-After`` seconds (capped the same). Other HTTP 4xx, a reply that is not JSON, a reply
without completions, or fewer completions than asked are not retried. The caller
(:class:`~comlrl_lightning.preference.comparator.policies.ApiComparator`) applies ``comparator_on_error``.

The key (``comparator_api_key_env``) is read from ``os.environ`` when a request is built, is never
an attribute of the client, and is replaced by ``***`` in every error message (a server may echo
headers back).
"""

from __future__ import annotations

import http.client
import json
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from comlrl_lightning.preference.comparator.config import ComparatorConfig

RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504})
"""HTTP statuses retried with backoff (overload and gateway errors); other statuses fail at once."""
MAX_BACKOFF_S = 30.0


class ComparatorError(RuntimeError):
    """A comparator request that failed (after its retries, when ``retryable``).

    Attributes:
        retryable: the cause was transient (timeout, connection, HTTP 408/429/5xx).
        status: the HTTP status, when the server answered.
        retry_after: seconds the server asked to wait (``Retry-After``), capped at 30.
    """

    def __init__(
        self,
        message: str,
        retryable: bool = False,
        status: int | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.retryable, self.status, self.retry_after = retryable, status, retry_after


class ApiClient:
    """Sends one prompt's requests to ``config.comparator_api_url`` and returns its completions.

    Args:
        config: the comparator config (``comparator_policy="api"``).
        sampling: ``max_new_tokens``, ``temperature``, ``top_p``, ``top_k`` of the request (the
            current policy's sampling knobs, as CoMLRL sends ``self.args``').
        sleep: waits between retries (seconds); tests pass a recorder.

    Raises:
        ValueError: ``comparator_api_key_env`` names a variable that is not set (before any request
            and, from :func:`~comlrl_lightning.preference.comparator.build.build_comparator`, before any model loads).

    Attributes:
        errors: failed HTTP attempts so far (every retry counted), for ``comparator/errors``.
        retries: retries made so far.
        requests: HTTP requests sent so far.
    """

    def __init__(
        self, config: ComparatorConfig, sampling: dict[str, Any], sleep: Callable[[float], None] = time.sleep
    ) -> None:
        env = config.comparator_api_key_env
        if env and not os.environ.get(env):
            raise ValueError(
                f"comparator_api_key_env: got {env!r}, but that environment variable is not set (or empty); "
                "export it, or give comparator_api_key_env: null for an endpoint without a key"
            )
        self.config, self.sampling, self.sleep = config, dict(sampling), sleep
        self.errors = self.retries = self.requests = 0
        # the requests of one sample may run in threads (comparator_api_concurrency)
        self._count = threading.Lock()

    # ------------------------------------------------------------------ one prompt
    def complete(self, prompt: str, num_candidates: int, agent: int = 0, episode: Any = None) -> list[str]:
        """``num_candidates`` completions of ``prompt`` (agent ``agent``'s, row ``episode``).

        Raises:
            ComparatorError: a request failed after its retries, or the replies held fewer than
                ``num_candidates`` completions.
        """
        fmt = self.config.comparator_api_format
        if fmt == "generic":
            texts = self._extract(self._post(self._generic_payload(prompt, agent, episode, num_candidates)))
        else:
            per_request = 1 if fmt != "openai_chat" else self.max_n_per_request(num_candidates)
            texts = []
            while len(texts) < num_candidates:
                n = min(per_request, num_candidates - len(texts))
                got = self._extract(self._post(self.payload(prompt, n)))
                if not got:
                    raise ComparatorError(f"{self._where()}: the reply held no completions (asked for {n})")
                texts.extend(got[:n])
        if len(texts) < num_candidates:
            raise ComparatorError(
                f"{self._where()}: the reply held {len(texts)} completions, {num_candidates} were asked for"
            )
        return texts[:num_candidates]

    def max_n_per_request(self, num_candidates: int) -> int:
        """Samples per ``openai_chat`` request: ``comparator_api_max_n_per_request`` capped at the count."""
        configured = self.config.comparator_api_max_n_per_request
        return num_candidates if configured is None else max(1, min(configured, num_candidates))

    # ------------------------------------------------------------------ payloads
    def payload(self, prompt: str, n: int) -> dict[str, Any]:
        """The request body of the OpenAI / Anthropic formats for ``n`` samples (None fields dropped)."""
        cfg, s = self.config, self.sampling
        if cfg.comparator_api_format == "openai_chat":
            body = {
                "model": cfg.comparator_api_model,
                "messages": [{"role": "user", "content": prompt}],
                "n": n,
                "max_tokens": s.get("max_new_tokens"),
                "temperature": s.get("temperature"),
                "top_p": s.get("top_p"),
            }
        elif cfg.comparator_api_format == "anthropic_messages":
            body = {
                "model": cfg.comparator_api_model,
                "max_tokens": s.get("max_new_tokens"),
                "messages": [{"role": "user", "content": prompt}],
                "temperature": s.get("temperature"),
            }
        else:
            body = {
                "model": cfg.comparator_api_model,
                "input": prompt,
                "max_output_tokens": s.get("max_new_tokens"),
            }
        body.update(cfg.comparator_api_extra_body or {})
        return {k: v for k, v in body.items() if v is not None}

    def _generic_payload(self, prompt: str, agent: int, episode: Any, n: int) -> dict[str, Any]:
        s = self.sampling
        body: dict[str, Any] = {
            "prompt": prompt,
            "agent_idx": agent,
            "num_return_sequences": n,
            "max_new_tokens": s.get("max_new_tokens"),
            "temperature": s.get("temperature"),
            "top_p": s.get("top_p"),
            "top_k": s.get("top_k"),
            "batch_item": jsonable(episode if episode is not None else {}),
        }
        if self.config.comparator_api_model:
            body["model"] = self.config.comparator_api_model
        body.update(self.config.comparator_api_extra_body or {})
        return body

    def headers(self) -> dict[str, str]:
        """Request headers, the key (from the environment) included; never store the result."""
        cfg = self.config
        headers = {"Content-Type": "application/json", **(cfg.comparator_api_headers or {})}
        anthropic = cfg.comparator_api_format == "anthropic_messages"
        if anthropic:
            headers.setdefault("anthropic-version", "2023-06-01")
        key = self._key()
        if key:
            name, prefix = cfg.comparator_api_key_header, cfg.comparator_api_key_prefix.strip()
            if anthropic and name.lower() == "authorization":
                name = "x-api-key"
            if anthropic and prefix.lower() == "bearer":
                prefix = ""
            headers[name] = f"{prefix} {key}" if prefix else key
        return headers

    def _key(self) -> str | None:
        env = self.config.comparator_api_key_env
        return os.environ.get(env) or None if env else None

    # ------------------------------------------------------------------ the wire
    def _post(self, body: dict[str, Any]) -> Any:
        retries = self.config.comparator_api_max_retries
        for attempt in range(retries + 1):
            try:
                return self._send(body)
            except ComparatorError as err:
                with self._count:
                    self.errors += 1
                if not err.retryable or attempt == retries:
                    raise
                with self._count:
                    self.retries += 1
                self.sleep(self._backoff(attempt) if err.retry_after is None else err.retry_after)
        raise AssertionError("unreachable")  # pragma: no cover

    def _backoff(self, attempt: int) -> float:
        return min(self.config.comparator_api_retry_backoff * 2**attempt, MAX_BACKOFF_S)

    def _send(self, body: dict[str, Any]) -> Any:
        with self._count:
            self.requests += 1
        request = urllib.request.Request(
            str(self.config.comparator_api_url),
            data=json.dumps(body).encode("utf-8"),
            headers=self.headers(),
            method="POST",
        )
        where = self._where()
        try:
            with urllib.request.urlopen(request, timeout=float(self.config.comparator_api_timeout)) as reply:
                raw = reply.read().decode("utf-8", errors="replace")
        except urllib.error.HTTPError as err:
            detail = self._redact(err.read().decode("utf-8", errors="replace")[:300])
            after = err.headers.get("Retry-After") if err.headers else None
            after_s = min(float(after), MAX_BACKOFF_S) if after and after.strip().isdigit() else None
            retryable = err.code in RETRYABLE_STATUS
            raise ComparatorError(
                f"{where}: HTTP {err.code}: {detail}", retryable, err.code, after_s
            ) from None
        except TimeoutError as err:
            raise ComparatorError(
                f"{where}: no reply within {self.config.comparator_api_timeout} s ({err})", True
            ) from None
        except (urllib.error.URLError, OSError, http.client.HTTPException) as err:
            reason = getattr(err, "reason", err)  # refused, reset, DNS, a connect timeout, a torn reply
            raise ComparatorError(f"{where}: {self._redact(str(reason))}", retryable=True) from None
        try:
            return json.loads(raw)
        except json.JSONDecodeError as err:
            raise ComparatorError(
                f"{where}: the reply is not JSON ({err.msg}): {self._redact(raw[:200])!r}"
            ) from None

    def _where(self) -> str:
        return f"comparator_api_url={self.config.comparator_api_url!r} ({self.config.comparator_api_format})"

    def _redact(self, text: str) -> str:
        key = self._key()
        return text.replace(key, "***") if key else text

    # ------------------------------------------------------------------ replies
    def _extract(self, reply: Any) -> list[str]:
        """The completions of one reply, per :data:`COMPARATOR_API_FORMAT` (none: an empty list)."""
        fmt = self.config.comparator_api_format
        if fmt == "openai_chat":
            out = []
            for choice in _dicts(reply.get("choices") if isinstance(reply, dict) else None):
                message = choice.get("message")
                if isinstance(message, dict) and message.get("content") is not None:
                    out.append(str(message["content"]))
                elif choice.get("text") is not None:
                    out.append(str(choice["text"]))
            return out
        if fmt == "anthropic_messages":
            blocks = reply.get("content") if isinstance(reply, dict) else None
            return [
                str(b["text"])
                for b in _dicts(blocks)
                if b.get("type") == "text" and b.get("text") is not None
            ]
        if fmt == "openai_responses":
            items = reply.get("output") if isinstance(reply, dict) else None
            return [
                str(b["text"])
                for item in _dicts(items)
                for b in _dicts(item.get("content"))
                if b.get("type") in ("output_text", "text") and b.get("text") is not None
            ]
        value = _dotted(reply, self.config.comparator_api_response_field)
        if value is None and isinstance(reply, dict):
            value = (
                reply.get("completions")
                or reply.get("responses")
                or reply.get("outputs")
                or reply.get("choices")
            )
        return _texts(value)


def _dicts(value: Any) -> list[dict[str, Any]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _dotted(data: Any, path: str | None) -> Any:
    for part in (path or "").split(".") if path else []:
        if not isinstance(data, dict) or part not in data:
            return None
        data = data[part]
    return data if path else None


def _texts(value: Any) -> list[str]:
    """CoMLRL's ``_normalize_completion_items``: strings, or ``text`` / ``content`` / ``completion`` /
    ``response`` / ``message.content`` of objects."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list):
        return [str(value)]
    out = []
    for item in value:
        if isinstance(item, str):
            out.append(item)
        elif isinstance(item, dict):
            text = item.get("text") or item.get("content") or item.get("completion") or item.get("response")
            if text is None and isinstance(item.get("message"), dict):
                text = item["message"].get("content")
            if text is not None:
                out.append(str(text))
        elif item is not None:
            out.append(str(item))
    return out


def jsonable(value: Any) -> Any:
    """``value`` with what JSON cannot hold turned into strings (CoMLRL ``_jsonable``)."""
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        pass
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if hasattr(value, "item"):
        try:
            return value.item()
        except (TypeError, ValueError, RuntimeError):
            pass
    return str(value)
