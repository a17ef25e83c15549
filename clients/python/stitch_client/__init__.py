"""Stitch from Python: publish a trainer's weights, request versioned rollouts.

Only the standard library is needed; NumPy arrays and PyTorch tensors are
published as they are when those libraries are installed::

    from stitch_client import Client

    client = Client(publisher="http://127.0.0.1:8082", gateway="http://127.0.0.1:8080")
    client.publish(model.state_dict(), run="exp-1", version=step)
    client.wait_until_serving(step)
    answer = client.generate("2 + 3 =", min_version=step - 2)
    answer["meta_info"]["weight_version_start"]

Every error the server answers is raised as :class:`StitchError`, carrying
the server's JSON (its ``type``, ``message``, ``retryable``).
"""

from __future__ import annotations

import base64
import http.client
import json
import math
import os
import ssl
import struct
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

__all__ = ["Client", "PublishSession", "StitchError", "TensorBytes", "checkpoint_files"]

#: Bytes sent per PUT of a publish session (the publisher bounds it too).
DEFAULT_CHUNK_BYTES = 16 << 20


class StitchError(Exception):
    """An error answer of a Stitch HTTP surface.

    ``status`` is the HTTP status, ``body`` the parsed JSON answer (or None),
    ``type`` and ``retryable`` come from it (DESIGN §5 error shape).
    """

    def __init__(self, status: int, body: Any, message: Optional[str] = None):
        self.status = status
        self.body = body
        err = body if isinstance(body, dict) else {}
        self.type: str = str(err.get("type", "HTTPError"))
        self.retryable: bool = bool(err.get("retryable", False))
        text = message or str(err.get("message", body))
        super().__init__(f"{status} {self.type}: {text}")


@dataclass
class TensorBytes:
    """A tensor given as its safetensors dtype name (``"F32"``, ``"BF16"``,
    ...), shape and raw little-endian bytes (any bytes-like object)."""

    dtype: str
    shape: Sequence[int]
    data: Any


# -- tensors ------------------------------------------------------------------

_TORCH_DTYPES = {
    "float32": "F32",
    "float16": "F16",
    "bfloat16": "BF16",
    "float64": "F64",
    "int64": "I64",
    "int32": "I32",
    "int16": "I16",
    "int8": "I8",
    "uint8": "U8",
    "bool": "BOOL",
    "float8_e4m3fn": "F8_E4M3",
    "float8_e5m2": "F8_E5M2",
}

_NUMPY_DTYPES = {
    "<f4": "F32",
    "<f2": "F16",
    "<f8": "F64",
    "<i8": "I64",
    "<i4": "I32",
    "<i2": "I16",
    "|i1": "I8",
    "|u1": "U8",
    "<u2": "U16",
    "<u4": "U32",
    "<u8": "U64",
    "|b1": "BOOL",
}


def _as_tensor(name: str, value: Any) -> Tuple[str, List[int], memoryview]:
    """(dtype, shape, bytes) of one tensor, without copying it when it is
    contiguous already."""
    if isinstance(value, TensorBytes):
        return value.dtype, [int(d) for d in value.shape], memoryview(value.data).cast("B")
    module = type(value).__module__
    if module.startswith("torch"):
        t = value.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        t = t.contiguous()
        key = str(t.dtype).replace("torch.", "")
        if key not in _TORCH_DTYPES:
            raise ValueError(f"tensor {name!r}: dtype {t.dtype} has no safetensors name")
        shape = list(t.shape)
        import torch  # present: `value` is one of its tensors

        flat = t.reshape(-1)
        raw = flat.view(torch.uint8) if flat.numel() else torch.empty(0, dtype=torch.uint8)
        return _TORCH_DTYPES[key], shape, memoryview(raw.numpy()).cast("B")
    if module.startswith("numpy"):
        import numpy as np

        a = np.ascontiguousarray(value)
        key = a.dtype.str
        if key not in _NUMPY_DTYPES:
            raise ValueError(f"tensor {name!r}: dtype {a.dtype} has no safetensors name")
        return _NUMPY_DTYPES[key], list(a.shape), memoryview(a.reshape(-1).view(np.uint8))
    raise TypeError(
        f"tensor {name!r}: expected a torch.Tensor, a numpy array or TensorBytes, "
        f"not {type(value).__name__}"
    )


@dataclass
class _Source:
    """One tensor to publish: its header and how to read its bytes."""

    name: str
    dtype: str
    shape: List[int]
    size: int
    view: Optional[memoryview] = None
    path: Optional[str] = None
    offset: int = 0

    def pieces(self, most: int) -> Iterator[memoryview]:
        if self.view is not None:
            for at in range(0, self.size, most):
                yield self.view[at : at + most]
            return
        assert self.path is not None
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            left = self.size
            while left > 0:
                chunk = f.read(min(most, left))
                if not chunk:
                    raise ValueError(f"{self.path}: tensor {self.name!r} is cut short")
                left -= len(chunk)
                yield memoryview(chunk)


def _safetensors_dir(path: str) -> List[_Source]:
    """The tensors of every ``*.safetensors`` file of a directory."""
    files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
    if not files:
        raise ValueError(f"{path}: no .safetensors files")
    out: Dict[str, _Source] = {}
    for f in files:
        full = os.path.join(path, f)
        with open(full, "rb") as fh:
            head = fh.read(8)
            if len(head) != 8:
                raise ValueError(f"{full}: too short for a safetensors file")
            (n,) = struct.unpack("<Q", head)
            if n > 100_000_000:
                raise ValueError(f"{full}: header of {n} bytes is over the spec's limit")
            header = json.loads(fh.read(n))
        base = 8 + n
        for name, spec in header.items():
            if name == "__metadata__":
                continue
            begin, end = spec["data_offsets"]
            if name in out:
                raise ValueError(f"{path}: tensor {name!r} is in two files")
            out[name] = _Source(
                name, spec["dtype"], list(spec["shape"]), end - begin, path=full, offset=base + begin
            )
    return [out[k] for k in sorted(out)]


#: Weights in other formats an HF directory may carry; not kept as files.
_OTHER_WEIGHTS = (".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".gguf", ".onnx", ".npz", ".pkl")


def checkpoint_files(path: str) -> Dict[str, bytes]:
    """The small non-tensor files of an HF directory (``config.json``,
    tokenizer files, ...) as `stitch publish` keeps them: every regular file
    except the shards, the index, hidden files and other weight formats."""
    out: Dict[str, bytes] = {}
    for f in sorted(os.listdir(path)):
        full = os.path.join(path, f)
        if (
            f.startswith(".")
            or f.endswith(".safetensors")
            or f == "model.safetensors.index.json"
            or f.endswith(_OTHER_WEIGHTS)
            or not os.path.isfile(full)
        ):
            continue
        with open(full, "rb") as fh:
            out[f] = fh.read()
    return out


def _files_json(files: Mapping[str, Union[str, bytes]]) -> Dict[str, Any]:
    """Files as the open request carries them: text as is, bytes as base64."""
    out: Dict[str, Any] = {}
    for name, data in files.items():
        if isinstance(data, str):
            out[name] = data
        else:
            out[name] = {"base64": base64.b64encode(bytes(data)).decode("ascii")}
    return out


def _sources(weights: Union[str, os.PathLike, Mapping[str, Any]]) -> List[_Source]:
    if isinstance(weights, (str, os.PathLike)):
        return _safetensors_dir(os.fspath(weights))
    out = []
    for name in sorted(weights):
        dtype, shape, view = _as_tensor(name, weights[name])
        out.append(_Source(name, dtype, shape, len(view), view=view))
    return out


# -- HTTP ---------------------------------------------------------------------


class _FileRanges:
    """A request body made of file ranges, sent with ``sendfile`` (the bytes
    go from the page cache to the socket without passing through Python)."""

    def __init__(self) -> None:
        self.ranges: List[Tuple[str, int, int]] = []
        self.size = 0

    def add(self, path: str, offset: int, size: int) -> None:
        if self.ranges:
            last_path, last_offset, last_size = self.ranges[-1]
            if last_path == path and last_offset + last_size == offset:
                self.ranges[-1] = (path, last_offset, last_size + size)
                self.size += size
                return
        self.ranges.append((path, offset, size))
        self.size += size

    def send(self, sock: Any) -> None:
        for path, offset, size in self.ranges:
            with open(path, "rb") as f:
                if os.fstat(f.fileno()).st_size < offset + size:
                    raise ValueError(f"{path}: shorter than its tensors say")
                sent = sock.sendfile(f, offset, size)
                if sent != size:
                    raise ConnectionError(f"{path}: sent {sent} of {size} bytes")


class _Endpoint:
    def __init__(
        self, url: str, token: Optional[str], timeout: float, cafile: Optional[str] = None
    ):
        u = urllib.parse.urlsplit(url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"{url!r} is not an http(s) URL")
        self.https = u.scheme == "https"
        self.host = u.hostname
        self.port = u.port or (443 if self.https else 80)
        self.prefix = u.path.rstrip("/")
        self.token = token
        self.timeout = timeout
        # https: the server's certificate is checked against `cafile` (the
        # cluster's tls.ca), else the system's CA certificates.
        self.tls = ssl.create_default_context(cafile=cafile) if self.https else None
        self._conn: Optional[http.client.HTTPConnection] = None

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            if self.https:
                self._conn = http.client.HTTPSConnection(
                    self.host, self.port, timeout=self.timeout, context=self.tls
                )
            else:
                self._conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        headers: Optional[Dict[str, str]] = None,
    ) -> Tuple[int, Dict[str, str], Any]:
        """One request; answers (status, headers, parsed JSON or text)."""
        h = dict(headers or {})
        if self.token:
            h["Authorization"] = f"Bearer {self.token}"
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
            h.setdefault("Content-Type", "application/json")
        elif body is not None:
            h.setdefault("Content-Type", "application/octet-stream")
        for attempt in (0, 1):
            conn = self._connection()
            try:
                if isinstance(body, _FileRanges):
                    conn.putrequest(method, self.prefix + path)
                    for k, v in h.items():
                        conn.putheader(k, v)
                    conn.putheader("Content-Length", str(body.size))
                    conn.endheaders()
                    body.send(conn.sock)
                else:
                    conn.request(method, self.prefix + path, body=body, headers=h)
                r = conn.getresponse()
                data = r.read()
                break
            except (ConnectionError, http.client.HTTPException):
                # A kept-alive connection the server closed: once more, fresh.
                self.close()
                if attempt == 1:
                    raise
        answer_headers = {k.lower(): v for k, v in r.getheaders()}
        if r.getheader("Connection", "").lower() == "close":
            self.close()
        try:
            parsed: Any = json.loads(data) if data else None
        except ValueError:
            parsed = data.decode("utf-8", "replace")
        return r.status, answer_headers, parsed

    def json(self, method: str, path: str, body: Any = None, headers=None) -> Any:
        status, _, parsed = self.call(method, path, body, headers)
        if status >= 400:
            raise StitchError(status, parsed)
        return parsed


# -- publishing ---------------------------------------------------------------


class PublishSession:
    """An open publish session: write the listed tensors' bytes in order,
    then :meth:`commit` (or :meth:`abort`). Use as a context manager to abort
    on an exception."""

    def __init__(self, endpoint: _Endpoint, opened: Dict[str, Any], chunk_bytes: int):
        self._ep = endpoint
        self.id: int = int(opened["session"])
        self.expects_bytes: int = int(opened["expects_bytes"])
        self.chunk_bytes = max(1, min(chunk_bytes, int(opened.get("max_request_bytes", chunk_bytes))))
        self._buffer = bytearray()
        self._ranges = _FileRanges()
        self.sent = 0
        self.done = False

    def write_file(self, path: str, offset: int, size: int) -> None:
        """Queues the next ``size`` bytes from ``path`` at ``offset``; they are
        sent straight from the file (``sendfile``) when a chunk is full."""
        self._flush_buffer()
        while size > 0:
            take = min(size, self.chunk_bytes - self._ranges.size)
            self._ranges.add(path, offset, take)
            offset += take
            size -= take
            if self._ranges.size == self.chunk_bytes:
                self._flush_ranges()

    def _flush_ranges(self) -> None:
        if self._ranges.size:
            ranges, self._ranges = self._ranges, _FileRanges()
            self._ep.json("PUT", f"/publish/{self.id}", ranges)
            self.sent += ranges.size

    def write(self, data: Any) -> None:
        """Queues the next bytes; sends a request whenever a chunk is full."""
        self._flush_ranges()
        view = memoryview(data).cast("B")
        while len(view) > 0:
            room = self.chunk_bytes - len(self._buffer)
            if not self._buffer and len(view) >= self.chunk_bytes:
                self._put(view[: self.chunk_bytes])  # no copy for whole chunks
                view = view[self.chunk_bytes :]
                continue
            self._buffer += view[:room]
            view = view[room:]
            if len(self._buffer) == self.chunk_bytes:
                self._flush()

    def _flush(self) -> None:
        self._flush_ranges()
        self._flush_buffer()

    def _flush_buffer(self) -> None:
        if self._buffer:
            self._put(memoryview(self._buffer))
            self._buffer = bytearray()

    def _put(self, piece: memoryview) -> None:
        self._ep.json("PUT", f"/publish/{self.id}", piece)
        self.sent += len(piece)

    def commit(self) -> Dict[str, Any]:
        """Sends what is queued and publishes: answers the version's ref,
        ``kind`` (anchor or delta), bytes and touched tensors."""
        self._flush()
        answer = self._ep.json("POST", f"/publish/{self.id}/commit")
        self.done = True
        return answer

    def abort(self) -> None:
        """Gives the session up: nothing of it becomes visible."""
        if not self.done:
            self.done = True
            try:
                self._ep.call("DELETE", f"/publish/{self.id}")
            except OSError:
                pass

    def __enter__(self) -> "PublishSession":
        return self

    def __exit__(self, kind, value, tb) -> None:
        if value is not None:
            self.abort()


# -- the client ---------------------------------------------------------------


def _retry_after(headers: Mapping[str, str]) -> float:
    """Seconds an answer's ``Retry-After`` asks to wait: its delay in
    seconds, or 1 when it is missing, negative, not a finite number, or an
    HTTP date (a proxy's)."""
    try:
        wait = float(headers.get("retry-after", "1"))
    except (TypeError, ValueError):
        return 1.0
    return wait if math.isfinite(wait) and wait >= 0 else 1.0


class Client:
    """One Stitch deployment: its publisher (for trainers) and its gateway
    (for rollout workers). ``token`` is the admin token, when the nodes
    require one.

    ``abort_on_disconnect``: open publish sessions bound to this client's
    connection, so that a trainer that dies in the middle of a publish, also
    between two requests, frees its session and its pool's publish queue the
    moment the node sees the connection close (otherwise a session left
    between requests goes at the publisher's idle timeout, 600 s by
    default). Only where the client reaches the publisher directly: a proxy
    that closes its own connections to the node (nginx's keepalive limits)
    would abort sessions that are alive.

    ``cafile``: for ``https://`` URLs (a publisher surface with
    ``publisher.tls``), the CA certificate that signed the node's
    certificate (the cluster's ``tls.ca``); without it the system's CAs."""

    def __init__(
        self,
        publisher: Optional[str] = None,
        gateway: Optional[str] = None,
        token: Optional[str] = None,
        timeout: float = 300.0,
        abort_on_disconnect: bool = False,
        cafile: Optional[str] = None,
    ):
        self.abort_on_disconnect = bool(abort_on_disconnect)
        self._publisher = _Endpoint(publisher, token, timeout, cafile) if publisher else None
        self._gateway = _Endpoint(gateway, token, timeout, cafile) if gateway else None

    def close(self) -> None:
        for e in (self._publisher, self._gateway):
            if e:
                e.close()

    def _pub(self) -> _Endpoint:
        if not self._publisher:
            raise ValueError("this client has no publisher URL")
        return self._publisher

    def _gw(self) -> _Endpoint:
        if not self._gateway:
            raise ValueError("this client has no gateway URL")
        return self._gateway

    # publishing

    def open_session(
        self,
        tensors: Sequence[Tuple[str, str, Sequence[int]]],
        run: str,
        version: int,
        pool: str = "default",
        anchor: bool = False,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        files: Optional[Mapping[str, Union[str, bytes]]] = None,
        retry_budget: float = 60.0,
    ) -> PublishSession:
        """Opens a publish session for ``tensors`` — (name, dtype, shape)
        in ascending name order — whose bytes follow with
        :meth:`PublishSession.write`. ``files`` are the checkpoint's small
        non-tensor files (``config.json``, ...; text or bytes), kept with the
        version byte for byte. A publisher that is busy (its sessions all
        taken: 503) is asked again, honoring ``Retry-After``, within
        ``retry_budget`` seconds."""
        body = {
            "pool": pool,
            "run_id": run,
            "version": int(version),
            "anchor": bool(anchor),
            "tensors": [{"name": n, "dtype": d, "shape": [int(x) for x in s]} for n, d, s in tensors],
        }
        if files:
            body["files"] = _files_json(files)
        if self.abort_on_disconnect:
            body["abort_on_disconnect"] = True
        deadline = time.monotonic() + retry_budget
        while True:
            status, h, answer = self._pub().call("POST", "/publish", body)
            if status < 400:
                return PublishSession(self._pub(), answer, chunk_bytes)
            err = StitchError(status, answer)
            wait = _retry_after(h)
            if status != 503 or not err.retryable or time.monotonic() + wait > deadline:
                raise err
            time.sleep(wait)

    def publish(
        self,
        weights: Union[str, os.PathLike, Mapping[str, Any]],
        run: str,
        version: int,
        pool: str = "default",
        anchor: bool = False,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        files: Optional[Mapping[str, Union[str, bytes]]] = None,
        retry_budget: float = 60.0,
    ) -> Dict[str, Any]:
        """Publishes ``weights`` — a state dict (torch tensors, numpy arrays
        or :class:`TensorBytes`) or a directory of ``.safetensors`` files —
        as ``version`` of ``run``. Streams each tensor's bytes in pieces of
        ``chunk_bytes``; never builds one large buffer. ``files`` (default:
        a directory's :func:`checkpoint_files`) are kept with the version:
        give a state dict's ``config.json`` here. A busy publisher is asked
        again within ``retry_budget`` seconds (:meth:`open_session`). Answers
        what was published (``ref``, ``kind``, ``stored_bytes``, ``touched``,
        ...)."""
        sources = _sources(weights)
        if files is None and isinstance(weights, (str, os.PathLike)):
            files = checkpoint_files(os.fspath(weights))
        session = self.open_session(
            [(s.name, s.dtype, s.shape) for s in sources], run, version, pool, anchor, chunk_bytes,
            files, retry_budget,
        )
        with session:
            for s in sources:
                if s.path is not None:
                    session.write_file(s.path, s.offset, s.size)
                    continue
                for piece in s.pieces(session.chunk_bytes):
                    session.write(piece)
            return session.commit()

    # rollouts

    def _versioned(
        self,
        route: str,
        body: Dict[str, Any],
        min_version: Optional[int],
        exact_version: Optional[int],
        retry_budget: float,
        session_id: Optional[str],
        pool: Optional[str],
    ) -> Dict[str, Any]:
        body = dict(body)
        if min_version is not None or exact_version is not None:
            body["weight_version"] = {"min_version": min_version, "exact_version": exact_version}
        headers = {}
        if session_id:
            headers["X-Session-Id"] = session_id
        if pool:
            headers["X-Stitch-Pool"] = pool
        deadline = time.monotonic() + retry_budget
        while True:
            status, h, answer = self._gw().call("POST", route, body, headers)
            if status < 400:
                if isinstance(answer, dict) and "x-stitch-replica" in h:
                    answer.setdefault("stitch_replica", h["x-stitch-replica"])
                return answer
            err = StitchError(status, answer)
            if status not in (409, 503) or not err.retryable:
                raise err
            wait = _retry_after(h)
            if time.monotonic() + wait > deadline:
                raise err
            time.sleep(wait)

    def generate(
        self,
        text: Optional[str] = None,
        input_ids: Optional[List[int]] = None,
        sampling_params: Optional[Dict[str, Any]] = None,
        min_version: Optional[int] = None,
        exact_version: Optional[int] = None,
        retry_budget: float = 60.0,
        session_id: Optional[str] = None,
        pool: Optional[str] = None,
        **extra: Any,
    ) -> Dict[str, Any]:
        """SGLang-native ``/generate`` under a version constraint; retryable
        409s and 503s are retried (honoring ``Retry-After``) within
        ``retry_budget`` seconds. The answer's ``meta_info`` carries the
        stamps (``weight_version_start`` / ``_end``)."""
        body: Dict[str, Any] = dict(extra)
        if text is not None:
            body["text"] = text
        if input_ids is not None:
            body["input_ids"] = input_ids
        if sampling_params is not None:
            body["sampling_params"] = sampling_params
        return self._versioned(
            "/generate", body, min_version, exact_version, retry_budget, session_id, pool
        )

    def chat(
        self,
        messages: List[Dict[str, Any]],
        min_version: Optional[int] = None,
        exact_version: Optional[int] = None,
        retry_budget: float = 60.0,
        session_id: Optional[str] = None,
        pool: Optional[str] = None,
        **extra: Any,
    ) -> Dict[str, Any]:
        """OpenAI ``/v1/chat/completions`` under a version constraint; the
        stamps are top-level ``weight_version_start`` / ``_end``."""
        body: Dict[str, Any] = dict(extra)
        body["messages"] = messages
        return self._versioned(
            "/v1/chat/completions", body, min_version, exact_version, retry_budget, session_id, pool
        )

    # the pool

    def status(self, pool: Optional[str] = None) -> Dict[str, Any]:
        """The gateway's ``/pool``: every replica's server_info and a summary."""
        headers = {"X-Stitch-Pool": pool} if pool else None
        return self._gw().json("GET", "/pool", headers=headers)

    def wait_until_serving(
        self,
        version: int,
        replicas: Optional[int] = None,
        run: Optional[str] = None,
        timeout: float = 300.0,
        pool: Optional[str] = None,
        poll: float = 0.2,
    ) -> Dict[str, Any]:
        """Waits until ``replicas`` ready replicas (default: every replica of
        the pool, at least one) serve ``version`` or newer (of ``run``, when
        given). Answers the pool's view; raises TimeoutError."""
        deadline = time.monotonic() + timeout
        view: Dict[str, Any] = {}
        while True:
            view = self.status(pool)
            infos = view.get("replicas", [])
            serving = [
                r
                for r in infos
                if r.get("ready")
                and isinstance(r.get("applied_version"), int)
                and r["applied_version"] >= version
                and (run is None or r.get("run_id") == run)
            ]
            want = replicas if replicas is not None else max(1, len(infos))
            if len(serving) >= want:
                return view
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"{len(serving)} of {want} replica(s) serve version {version} or newer "
                    f"after {timeout} s"
                )
            time.sleep(poll)
