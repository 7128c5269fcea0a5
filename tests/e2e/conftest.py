"""Shared helpers for the end-to-end tests of the inference-engine CLI.

Environment:
  IE_BIN           the CLI binary (default <repo>/build/inference-engine)
  IE_FIXTURES_DIR  where the reference fixtures live (default <repo>/tests/data);
                   tests/reference/regen.sh points it at freshly generated ones
  IE_SMOLLM2       the real model (default <repo>/models/SmolLM2-135M-Instruct.Q4_1.gguf)
  IE_TEST_THREADS  --threads passed to the CLI (default 2)

A missing binary, model or fixture is a test FAILURE, never a skip.
"""
from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
IE_BIN = Path(os.environ.get("IE_BIN", REPO / "build" / "inference-engine"))
FIXTURES = Path(os.environ.get("IE_FIXTURES_DIR", REPO / "tests" / "data"))
SMOLLM2 = Path(os.environ.get("IE_SMOLLM2", REPO / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
THREADS = int(os.environ.get("IE_TEST_THREADS", "2"))

EXIT_USAGE = 2      # bad flags / bad prompt text
EXIT_MODEL = 3      # model file missing / malformed

RUN_FIELDS = ("model", "prompts", "tokens_in", "tokens_out", "wall_s", "tps", "prefill_tps",
              "decode_tps", "ttft_ms", "latency_p50_ms", "latency_p95_ms", "rss_peak_mb",
              "kv_hits", "kv_misses", "preemptions", "threads", "precision", "text", "ids")


def need_file(p: Path, what: str) -> Path:
    if not p.is_file():
        pytest.fail(f"{what} not found at {p}", pytrace=False)
    return p


# Where the binaries are (IE_BUILD_DIR, default <repo>/build).
BUILD = Path(os.environ.get("IE_BUILD_DIR", REPO / "build"))
if not BUILD.is_absolute():
    BUILD = REPO / BUILD


def binary(name: str) -> Path:
    """BUILD/name, failing (never skipping) when it is missing or not executable."""
    p = need_file(BUILD / name, f"{name} (set IE_BUILD_DIR or build it)")
    if not os.access(p, os.X_OK):
        pytest.fail(f"{p} is not executable", pytrace=False)
    return p


_PORTS_HELD: list = []


def free_port() -> int:
    """A TCP port on 127.0.0.1 for a server a test starts, free now and kept
    from other tests until this process ends.

    Picking a port with bind(0) and closing it races: the kernel hands the
    same ephemeral port to the next bind(0) or outgoing connection of any
    process (seen: a coordinator's "Address already in use" while another
    suite ran). So the port comes from below the ephemeral range (the
    kernel never gives those out by itself) and is reserved across test
    processes by an flock on /tmp/ie-test-ports/PORT, held (and released
    by the kernel) for this process's life."""
    import fcntl
    import random
    try:
        lo_eph = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        lo_eph = 32768
    top = max(lo_eph, 12000)
    d = Path(os.environ.get("TMPDIR", "/tmp")) / "ie-test-ports"
    d.mkdir(exist_ok=True)
    rng = random.Random(os.getpid() ^ time.monotonic_ns())
    for _ in range(500):
        port = rng.randrange(10000, top)
        f = open(d / str(port), "a")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.close()
            continue
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind(("127.0.0.1", port))     # nothing listens there now
        except OSError:
            f.close()
            continue
        _PORTS_HELD.append(f)
        return port
    raise RuntimeError("no free test port in 500 tries")


def fixture_path(rel: str) -> Path:
    p = FIXTURES / rel
    if not p.exists():
        pytest.fail(f"fixture {rel} missing under {FIXTURES} "
                    "(run tests/reference/gen_tiny_llama.py / gen_smollm2_ref.py)", pytrace=False)
    return p


@pytest.fixture(scope="session")
def ie_bin() -> Path:
    p = need_file(IE_BIN, "inference-engine binary (set IE_BIN or build it)")
    if not os.access(p, os.X_OK):
        pytest.fail(f"{p} is not executable", pytrace=False)
    return p


@pytest.fixture(scope="session")
def smollm2() -> Path:
    return need_file(SMOLLM2, "SmolLM2 GGUF (run scripts/setup.sh)")


# ------------------------------------------------------------------- running
def run_cli(args, *, timeout: float = 120, input_bytes: bytes | None = None,
            env: dict | None = None) -> subprocess.CompletedProcess:
    """Run the CLI; returns the CompletedProcess with str stdout/stderr
    (bytes decoded with errors='replace'). `env` adds to os.environ."""
    if not (IE_BIN.is_file() and os.access(IE_BIN, os.X_OK)):
        pytest.fail(f"inference-engine binary not found or not executable at {IE_BIN} "
                    "(set IE_BIN or build it)", pytrace=False)
    cmd = [str(IE_BIN)] + [str(a) for a in args]
    try:
        cp = subprocess.run(cmd, input=input_bytes, capture_output=True, timeout=timeout,
                            env={**os.environ, **env} if env else None)
    except subprocess.TimeoutExpired:
        pytest.fail(f"timed out after {timeout}s: {' '.join(cmd)}", pytrace=False)
    return subprocess.CompletedProcess(cp.args, cp.returncode,
                                       cp.stdout.decode("utf-8", "replace"),
                                       cp.stderr.decode("utf-8", "replace"))


def parse_single_json_line(stdout: str) -> dict:
    """stdout must be exactly one line holding one JSON object."""
    lines = stdout.splitlines()
    assert len(lines) == 1, f"expected exactly one stdout line, got {len(lines)}: {stdout[:500]!r}"
    assert stdout.endswith("\n"), "stdout line should end with a newline"
    obj = json.loads(lines[0])
    assert isinstance(obj, dict), obj
    return obj


def run_json(args, *, timeout: float = 120, env: dict | None = None) -> dict:
    cp = run_cli(args, timeout=timeout, env=env)
    assert cp.returncode == 0, (f"exit {cp.returncode}: {' '.join(map(str, cp.args))}\n"
                                f"stderr: {cp.stderr[-2000:]}")
    return parse_single_json_line(cp.stdout)


def read_logits(path: Path, n_tokens: int, n_vocab: int) -> np.ndarray:
    raw = np.fromfile(path, dtype="<f4")
    assert raw.size == n_tokens * n_vocab, \
        f"{path}: {raw.size} floats, expected {n_tokens}x{n_vocab}"
    return raw.reshape(n_tokens, n_vocab).astype(np.float32)


def engine_logits(model: Path, ids, out_dir: Path, *, precision: str = "native",
                  mode: str = "prefill", threads: int = THREADS, timeout: float = 300,
                  env: dict | None = None) -> np.ndarray:
    """The engine's logits for ids (`logits` mode); env adds to the environment."""
    ids = [int(i) for i in ids]
    out = out_dir / f"logits_{precision}_{mode}_{len(ids)}.f32"
    info = run_json(["logits", "--model", model, "--ids", ",".join(map(str, ids)),
                     "--precision", precision, "--mode", mode, "--threads", threads,
                     "--out", out], timeout=timeout, env=env)
    assert info.get("n_tokens") == len(ids), info
    n_vocab = info.get("n_vocab")
    assert isinstance(n_vocab, int) and n_vocab > 0, info
    lg = read_logits(out, len(ids), n_vocab)
    assert np.all(np.isfinite(lg)), "non-finite logits"
    return lg


# ----------------------------------------------------------------- metrics
def row_rel_err(ours: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """Per row: max|ours-ref| / max|ref|."""
    return np.max(np.abs(ours - ref), axis=-1) / np.max(np.abs(ref), axis=-1)


# ------------------------------------------------------ GGUF layout for patches
@dataclass
class GGUFTensorLoc:
    name: str
    n_dims: int
    dims_pos: int      # file offset of dims[0] (u64 each)
    type_pos: int      # file offset of the u32 ggml type
    offset_pos: int    # file offset of the u64 data offset


@dataclass
class GGUFLayout:
    version: int
    n_tensors: int
    n_kv: int
    tensors: list
    data_start: int


_SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def gguf_layout(buf: bytes) -> GGUFLayout:
    """Minimal independent GGUF v2/v3 header walk (positions for patch tests)."""
    assert buf[:4] == b"GGUF"
    pos = 4
    version, n_tensors, n_kv = struct.unpack_from("<IQQ", buf, pos)
    pos += 20
    alignment = 32

    def read_str(p):
        (n,) = struct.unpack_from("<Q", buf, p)
        return buf[p + 8:p + 8 + n].decode("utf-8"), p + 8 + n

    def skip_value(t, p):
        if t in _SCALAR:
            return p + _SCALAR[t]
        if t == 8:
            return read_str(p)[1]
        if t == 9:
            et, n = struct.unpack_from("<IQ", buf, p)
            p += 12
            if et in _SCALAR:
                return p + _SCALAR[et] * n
            for _ in range(n):
                p = skip_value(et, p)
            return p
        raise ValueError(f"bad kv type {t}")

    for _ in range(n_kv):
        key, pos = read_str(pos)
        (t,) = struct.unpack_from("<I", buf, pos)
        pos += 4
        if key == "general.alignment":
            (alignment,) = struct.unpack_from("<I", buf, pos)
        pos = skip_value(t, pos)
    tensors = []
    for _ in range(n_tensors):
        name, pos = read_str(pos)
        (nd,) = struct.unpack_from("<I", buf, pos)
        dims_pos = pos + 4
        pos = dims_pos + 8 * nd
        tensors.append(GGUFTensorLoc(name, nd, dims_pos, pos, pos + 4))
        pos += 12
    data_start = (pos + alignment - 1) // alignment * alignment
    return GGUFLayout(version, n_tensors, n_kv, tensors, data_start)


# ---- safetensors without torch: numpy has no bfloat16, so BF16 tensors are
# read and written as their raw uint16 bit patterns (slicing, stacking and
# concatenating move them intact); the default run must not need torch.
_ST_NP = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "I32": np.int32, "I64": np.int64,
          "U8": np.uint8}
_ST_NAME = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16", np.dtype(np.uint16): "BF16",
            np.dtype(np.int32): "I32", np.dtype(np.int64): "I64", np.dtype(np.uint8): "U8"}


def st_load(path) -> dict:
    """name -> numpy array of a safetensors file (BF16 as uint16 bits)."""
    buf = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", buf[:8])
    head = json.loads(buf[8:8 + n])
    out = {}
    for name, e in head.items():
        if name == "__metadata__":
            continue
        a, b = e["data_offsets"]
        out[name] = np.frombuffer(buf[8 + n + a:8 + n + b], dtype=_ST_NP[e["dtype"]]).reshape(e["shape"]).copy()
    return out


def st_save(path, tensors: dict) -> None:
    """Write name -> numpy array as safetensors (uint16 arrays are BF16)."""
    head, blobs, off = {}, [], 0
    for name in sorted(tensors):
        arr = np.ascontiguousarray(tensors[name])
        data = arr.tobytes()
        head[name] = {"dtype": _ST_NAME[arr.dtype], "shape": list(arr.shape), "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    head["__metadata__"] = {"format": "pt"}
    h = json.dumps(head, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    Path(path).write_bytes(struct.pack("<Q", len(h)) + h + b"".join(blobs))
