"""What a store's error means for the user, and its one line without secrets.

A leaf (checkpoint/, data/, run/ and cli/ all use it; it imports no cloud SDK, classes are matched by name):

* ``describe``, ``redact_url``, ``secret_values`` and ``scrub`` turn an error into text that names the URL and
  the cause but no credential;
* ``is_refusal`` tells a refused access (no credentials found, a wrong key or signature, no permission: 401,
  403) from every other failure. A refusal fails the same way on every retry and in every restarted attempt,
  so goodput stops at once with ``AccessRefused``: exit 2 on the command line, ``EXIT_FATAL`` in a run;
* ``refusals_named`` turns a refusal raised inside it into that ``AccessRefused``, whose one line names the URL
  and where credentials are read from (``credentials_source``).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from goodput.errors import AccessRefused

__all__ = [
    "access_refused",
    "code_of",
    "credentials_source",
    "describe",
    "is_refusal",
    "redact_url",
    "refusals_named",
    "scrub",
    "secret_values",
    "status_of",
]

# Exceptions (by class name) that mean the store refused who we are or what we asked; PermissionError is s3fs's
# (and the OS's) translation of 403 and of the refusal codes below.
_REFUSAL_NAMES = frozenset({"NoCredentialsError", "PartialCredentialsError", "PermissionError"})
_REFUSAL_CODES = frozenset(
    {
        "AccessDenied",
        "AccountProblem",
        "AllAccessDisabled",
        "ExpiredToken",
        "InvalidAccessKeyId",
        "InvalidSecurity",
        "InvalidToken",
        "NotSignedUp",
        "SignatureDoesNotMatch",
    }
)
# A 403 that a restart can fix: the clock, not the credentials (s3fs translates it to PermissionError too).
_NOT_REFUSALS = frozenset({"RequestTimeTooSkewed"})
_SECRET_KEY_HINTS = ("key", "secret", "token", "pass", "cred", "sig", "auth", "sas")
_USERINFO = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*://)[^/@]*@")


def _chain(err: BaseException) -> Iterator[BaseException]:
    """``err`` and the errors it was raised from or while handling (a few levels)."""
    seen: BaseException | None = err
    for _ in range(8):
        if seen is None:
            return
        yield seen
        seen = seen.__cause__ or seen.__context__


def status_of(err: BaseException) -> int | None:
    """The HTTP status an error (or its cause) carries, if any."""
    for source in (err, err.__cause__, err.__context__):
        if source is None:
            continue
        status = getattr(source, "status", None)
        if isinstance(status, int) and 100 <= status < 600:
            return status
        response = getattr(source, "response", None)
        if isinstance(response, dict):
            meta = response.get("ResponseMetadata", {})
            if isinstance(meta.get("HTTPStatusCode"), int):
                return int(meta["HTTPStatusCode"])
    return None


def code_of(err: BaseException) -> str | None:
    """The store's error code (``AccessDenied``, ``SlowDown``) an error (or its cause) carries, if any."""
    for source in (err, err.__cause__, err.__context__):
        response = getattr(source, "response", None)
        if isinstance(response, dict):
            code = response.get("Error", {}).get("Code")
            if isinstance(code, str):
                return code
    return None


def is_refusal(err: BaseException) -> bool:
    """Whether the store refused access: no credentials, wrong ones, or no permission (401/403)."""
    chain = list(_chain(err))
    if any(code_of(e) in _NOT_REFUSALS for e in chain):
        return False
    for source in chain:
        if {cls.__name__ for cls in type(source).__mro__} & _REFUSAL_NAMES:
            return True
        if status_of(source) in (401, 403) or code_of(source) in _REFUSAL_CODES:
            return True
    return False


def secret_values(storage_options: Mapping[str, Any]) -> list[str]:
    """Every string in the options stored under a key that looks like a credential (to scrub from text)."""
    found: list[str] = []

    def walk(value: Any, key: str) -> None:
        if isinstance(value, Mapping):
            for k, v in value.items():
                walk(v, str(k).lower())
        elif isinstance(value, (list, tuple)):
            for v in value:
                walk(v, key)
        elif isinstance(value, str) and len(value) >= 4 and any(h in key for h in _SECRET_KEY_HINTS):
            found.append(value)

    walk(storage_options, "")
    return sorted(found, key=len, reverse=True)


def redact_url(url: str) -> str:
    """The URL without user:password@ and without a query string (which may hold a signature)."""
    url = _USERINFO.sub(r"\1", url)
    return url.split("?", 1)[0] + ("?<redacted>" if "?" in url else "")


def scrub(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every secret replaced by ``<redacted>``."""
    for secret in secrets:
        text = text.replace(secret, "<redacted>")
    return text


def describe(err: BaseException, secrets: Iterable[str]) -> str:
    """One line about an error for a message: its type and text, credentials removed."""
    text = str(err).strip().splitlines()[0] if str(err).strip() else ""
    status, code = status_of(err), code_of(err)
    parts = [str(status)] if status is not None else []
    if code is not None and code not in parts:
        parts.append(code)
    http = " ".join(parts)
    line = f"{type(err).__name__}: {text}" if text else type(err).__name__
    return scrub(f"{line} (HTTP {http})" if http else line, secrets)


def credentials_source(url: str) -> str:
    """Where the store's client reads credentials from, for ``url``'s scheme (what to check or set)."""
    scheme = url.split("://", 1)[0].lower() if "://" in url else "file"
    if scheme in ("s3", "s3a"):
        return (
            "credentials are read from storage_options (key, secret), else AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY, else AWS_PROFILE and ~/.aws/credentials; the endpoint from storage_options "
            "client_kwargs endpoint_url or AWS_ENDPOINT_URL"
        )
    if scheme in ("gs", "gcs"):
        return (
            "credentials are read from storage_options (token), else GOOGLE_APPLICATION_CREDENTIALS, else "
            "gcloud's application-default credentials"
        )
    if scheme in ("az", "abfs", "abfss", "adl"):
        return (
            "credentials are read from storage_options (account_name with account_key, sas_token or "
            "connection_string), else AZURE_STORAGE_CONNECTION_STRING or AZURE_STORAGE_ACCOUNT_NAME and "
            "AZURE_STORAGE_ACCOUNT_KEY"
        )
    if scheme == "file":
        return "this user must be allowed to read and write that folder"
    return f"credentials are read from the {scheme}:// filesystem's storage_options"


def access_refused(
    url: str, err: BaseException, *, verb: str = "reach", secrets: Iterable[str] = ()
) -> AccessRefused:
    """The ``AccessRefused`` for ``err``: one line with the URL, the cause and where credentials come from."""
    return AccessRefused(
        f"cannot {verb} {redact_url(url)} (access refused, a permanent error): {describe(err, secrets)}; "
        f"{credentials_source(url)}"
    )


@contextlib.contextmanager
def refusals_named(
    url: str, storage_options: Mapping[str, Any] | None = None, *, verb: str = "reach"
) -> Iterator[None]:
    """Re-raise a refusal raised inside as ``AccessRefused`` naming ``url``; every other error passes as it is."""
    try:
        yield
    except AccessRefused:
        raise
    except Exception as err:
        if not is_refusal(err):
            raise
        raise access_refused(url, err, verb=verb, secrets=secret_values(storage_options or {})) from None
