"""clocher — Python bindings (ctypes) for libclocher (include/clocher.h).

    import clocher
    with clocher.Engine("models/SmolLM2-135M-Instruct.Q4_1.gguf", threads=2) as e:
        print(e.generate("The capital of France is", max_tokens=16, temperature=0))
        for piece in e.stream("Once upon a time", max_tokens=32):
            print(piece, end="", flush=True)

Options are the C API's keys (include/clocher.h): engine options as keyword
arguments of Engine (threads, pin, ctx, seqs, max_batch, precision, plan,
tokenizer, kv_block, kv_blocks, prefix_cache), generation options as keyword
arguments of generate / stream / chat (max_tokens, temperature, top_k, top_p,
min_p, repeat_penalty, repeat_last_n, frequency_penalty, presence_penalty,
seed, stop (a string or a list), add_special, parse_special). Failures raise
ClocherError with the status name and the library's reason.

An Engine runs one call at a time (a lock serializes them).
"""
from __future__ import annotations

import codecs
import ctypes
import ctypes.util
import os
import queue
import sys
import threading
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional

__all__ = ["Engine", "ClocherError", "version", "load_library"]
__version__ = "0.1.0"


class ClocherError(RuntimeError):
    """A failed library call: `status` is the ie_status_t name (e.g.
    "IE_ERR_INVAL"), `message` the library's one-line reason."""

    def __init__(self, status: str, message: str):
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


# ---------------------------------------------------------------- the library

_TOKEN_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int32, ctypes.c_void_p, ctypes.c_size_t)


class _GenInfo(ctypes.Structure):
    _fields_ = [("n_prompt", ctypes.c_size_t), ("n_gen", ctypes.c_size_t), ("finish", ctypes.c_char_p),
                ("ttft_ms", ctypes.c_double), ("total_ms", ctypes.c_double)]


class _Metrics(ctypes.Structure):
    _fields_ = [("requests", ctypes.c_uint64), ("tokens_in", ctypes.c_uint64), ("tokens_out", ctypes.c_uint64),
                ("kv_hits", ctypes.c_uint64), ("kv_misses", ctypes.c_uint64), ("prefill_tps", ctypes.c_double),
                ("decode_tps", ctypes.c_double), ("tps", ctypes.c_double), ("latency_p50_ms", ctypes.c_double),
                ("latency_p95_ms", ctypes.c_double), ("ttft_p50_ms", ctypes.c_double),
                ("rss_peak_mb", ctypes.c_double)]


def _candidates() -> Iterable[str]:
    env = os.environ.get("CLOCHER_LIBRARY")
    if env:
        yield env
        return  # an explicit choice is not second-guessed
    found = ctypes.util.find_library("clocher")
    if found:
        yield found
    prefixes = [sys.prefix, "/usr/local", "/usr", os.path.expanduser("~/.local"), "/opt/clocher"]
    for p in prefixes:
        for lib in ("lib", "lib64", "lib/x86_64-linux-gnu"):
            for name in ("libclocher.so.0", "libclocher.so"):
                yield os.path.join(p, lib, name)


_lib = None


def load_library() -> ctypes.CDLL:
    """The loaded libclocher (loaded on first use; see the module's doc for
    where it is looked for). Raises OSError when it cannot be found."""
    global _lib
    if _lib is not None:
        return _lib
    tried = []
    for path in _candidates():
        try:
            lib = ctypes.CDLL(path)
        except OSError as exc:
            tried.append(f"{path} ({exc})")
            continue
        _declare(lib)
        _lib = lib
        return lib
    raise OSError("libclocher not found; set CLOCHER_LIBRARY to its path. Tried: " + "; ".join(tried))


def _declare(lib: ctypes.CDLL) -> None:
    st, p, c = ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p
    pp = ctypes.POINTER(ctypes.c_void_p)
    sigs = {
        "ie_status_str": (c, [st]),
        "ie_error_last": (c, []),
        "ie_free": (None, [p]),
        "ie_version": (c, []),
        "ie_params_new": (st, [pp]),
        "ie_params_set": (st, [p, c, c]),
        "ie_params_destroy": (None, [pp]),
        "ie_engine_create": (st, [c, p, pp]),
        "ie_engine_destroy": (None, [pp]),
        "ie_engine_generate": (st, [p, c, p, _TOKEN_FN, p, pp, ctypes.POINTER(_GenInfo)]),
        "ie_engine_chat": (st, [p, ctypes.POINTER(c), ctypes.POINTER(c), ctypes.c_size_t, p, _TOKEN_FN, p, pp,
                                ctypes.POINTER(_GenInfo)]),
        "ie_engine_tokenize": (st, [p, c, ctypes.c_int, ctypes.POINTER(ctypes.POINTER(ctypes.c_int32)),
                                    ctypes.POINTER(ctypes.c_size_t)]),
        "ie_engine_detokenize": (st, [p, ctypes.POINTER(ctypes.c_int32), ctypes.c_size_t, pp]),
        "ie_engine_get_metrics": (st, [p, ctypes.POINTER(_Metrics)]),
        "ie_engine_n_vocab": (ctypes.c_size_t, [p]),
    }
    for name, (res, args) in sigs.items():
        fn = getattr(lib, name)
        fn.restype = res
        fn.argtypes = args


def version() -> str:
    """The library's version, e.g. "0.1.0"."""
    return load_library().ie_version().decode()


def _check(st: int) -> None:
    """Raise ClocherError for a failed status. Must run on the thread that
    made the call: the reason is per thread."""
    if st != 0:
        lib = load_library()
        raise ClocherError(lib.ie_status_str(st).decode(), lib.ie_error_last().decode("utf-8", "replace"))


def _value(v: Any) -> str:
    if v is None:
        raise ClocherError("IE_ERR_INVAL", "an option's value is None")
    if isinstance(v, bool):
        return "1" if v else "0"
    s = str(v)
    if "\0" in s:  # C strings end there: refuse rather than truncate
        raise ClocherError("IE_ERR_INVAL", "an option's value contains a NUL character")
    return s


class _Params:
    """An ie_params_t built from keyword arguments ("stop" may be a list)."""

    def __init__(self, kv: Mapping[str, Any]):
        lib = load_library()
        self.ptr = ctypes.c_void_p()
        _check(lib.ie_params_new(ctypes.byref(self.ptr)))
        try:
            for k, v in kv.items():
                values = v if k == "stop" and isinstance(v, (list, tuple)) else [v]
                for one in values:
                    _check(lib.ie_params_set(self.ptr, k.encode(), _value(one).encode()))
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        load_library().ie_params_destroy(ctypes.byref(self.ptr))

    def __enter__(self) -> "_Params":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


# ---------------------------------------------------------------- the engine

class Engine:
    """A loaded model (ie_engine_t). Use as a context manager or call
    close(); keyword arguments are engine options (module doc)."""

    def __init__(self, model: str, **opts: Any):
        self._lib = load_library()
        self._ptr = ctypes.c_void_p()
        self._lock = threading.Lock()
        self.last_info: Dict[str, Any] = {}
        with _Params(opts) as p:
            _check(self._lib.ie_engine_create(os.fspath(model).encode(), p.ptr, ctypes.byref(self._ptr)))

    def close(self) -> None:
        """Free the engine (idempotent)."""
        with self._lock:
            if self._ptr:
                self._lib.ie_engine_destroy(ctypes.byref(self._ptr))

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def _engine(self) -> ctypes.c_void_p:
        if not self._ptr:
            raise ClocherError("IE_ERR_INVAL", "the engine is closed")
        return self._ptr

    @property
    def n_vocab(self) -> int:
        return int(self._lib.ie_engine_n_vocab(self._engine()))

    # -- generation: one body for generate / stream / chat

    def _run(self, prompt: Optional[str], messages: Optional[List[Mapping[str, str]]], gen: Mapping[str, Any],
             on_piece: Optional[Any] = None) -> str:
        """One call of ie_engine_generate (prompt) or ie_engine_chat
        (messages); on_piece(text) -> bool (True stops) sees every piece."""
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        raised: List[BaseException] = []

        def cb(user: Any, tok: int, text: int, n: int) -> int:
            try:
                piece = decoder.decode(ctypes.string_at(text, n) if n else b"")
                return 1 if on_piece(piece) else 0
            except BaseException as exc:  # never unwind through C: stop, re-raise after the call
                raised.append(exc)
                return 1

        c_cb = _TOKEN_FN(cb) if on_piece is not None else _TOKEN_FN()
        out = ctypes.c_void_p()
        info = _GenInfo()
        with self._lock, _Params(gen) as p:
            if messages is None:
                raw = prompt if isinstance(prompt, bytes) else prompt.encode()
                st = self._lib.ie_engine_generate(self._engine(), raw, p.ptr, c_cb, None,
                                                  ctypes.byref(out), ctypes.byref(info))
            else:
                n = len(messages)
                roles = (ctypes.c_char_p * max(n, 1))(*[str(m["role"]).encode() for m in messages])
                contents = (ctypes.c_char_p * max(n, 1))(*[str(m["content"]).encode() for m in messages])
                st = self._lib.ie_engine_chat(self._engine(), roles, contents, n, p.ptr, c_cb, None,
                                              ctypes.byref(out), ctypes.byref(info))
            if raised:
                self._lib.ie_free(out)
                raise raised[0]
            _check(st)
        try:
            text = ctypes.string_at(out.value).decode("utf-8", "replace")
        finally:
            self._lib.ie_free(out)
        self.last_info = {"n_prompt": info.n_prompt, "n_gen": info.n_gen, "finish": info.finish.decode(),
                          "ttft_ms": info.ttft_ms, "total_ms": info.total_ms}
        return text

    def generate(self, prompt: str, **gen: Any) -> str:
        """The generated continuation of `prompt` (str, or UTF-8 bytes, which
        the library checks). self.last_info then holds
        n_prompt, n_gen, finish, ttft_ms, total_ms."""
        return self._run(prompt, None, gen)

    def chat(self, messages: List[Mapping[str, str]], **gen: Any) -> str:
        """The assistant's reply to messages [{"role", "content"}, ...],
        rendered with the model's chat template."""
        return self._run(None, list(messages), gen)

    def stream(self, prompt: str, **gen: Any) -> Iterator[str]:
        """Yield the generated text piece by piece as it comes ("".join of
        the pieces is generate's text). Leaving the loop early (break,
        close(), an exception) cancels the generation. Pass messages=[...]
        instead of a prompt (prompt=None) to stream a chat reply."""
        messages = gen.pop("messages", None)
        return self._stream(prompt, messages, gen)

    def _stream(self, prompt: Optional[str], messages: Any, gen: Mapping[str, Any]) -> Iterator[str]:
        q: "queue.Queue[Any]" = queue.Queue()
        stop = threading.Event()
        done = object()

        def on_piece(piece: str) -> bool:
            if piece:
                q.put(piece)
            return stop.is_set()

        def work() -> None:
            try:
                self._run(prompt, messages, gen, on_piece)
                q.put(done)
            except BaseException as exc:  # handed to the consumer
                q.put(exc)

        t = threading.Thread(target=work, name="clocher-stream", daemon=True)
        t.start()
        try:
            while True:
                item = q.get()
                if item is done:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            stop.set()  # the next token's callback cancels the call
            t.join()

    # -- tokens

    def tokenize(self, text: str, add_special: bool = True) -> List[int]:
        """Token ids of `text` (BOS/EOS as the model's rules say when
        add_special; special-token text becomes special tokens)."""
        ids = ctypes.POINTER(ctypes.c_int32)()
        n = ctypes.c_size_t()
        with self._lock:
            _check(self._lib.ie_engine_tokenize(self._engine(), text.encode(), int(bool(add_special)),
                                                ctypes.byref(ids), ctypes.byref(n)))
        try:
            return [ids[i] for i in range(n.value)]
        finally:
            self._lib.ie_free(ids)

    def detokenize(self, ids: Iterable[int]) -> str:
        """The text of `ids` (special tokens as their text)."""
        ids = list(ids)
        arr = (ctypes.c_int32 * max(len(ids), 1))(*ids)
        out = ctypes.c_void_p()
        with self._lock:
            _check(self._lib.ie_engine_detokenize(self._engine(), arr, len(ids), ctypes.byref(out)))
        try:
            return ctypes.string_at(out.value).decode("utf-8", "replace")
        finally:
            self._lib.ie_free(out)

    def metrics(self) -> Dict[str, float]:
        """Running totals over the engine's life (ie_engine_metrics_t)."""
        m = _Metrics()
        with self._lock:
            _check(self._lib.ie_engine_get_metrics(self._engine(), ctypes.byref(m)))
        return {name: getattr(m, name) for name, _ in _Metrics._fields_}
