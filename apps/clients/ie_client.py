#!/usr/bin/env python3
"""ie_client.py — a small client of the coordinator's client endpoint.

The coordinator (ie-coordinator --client-bind EP) runs a ROUTER socket that
takes MessagePack maps (see common/net/ie_proto.h):

    {"v":1, "type":"generate", "id":str, "prompt":str | "messages":[...],
     "max_new":int, "temperature":float, ..., "stream":bool}

and answers with {"type":"token",...} events (when streaming), then one
{"type":"done",...} or {"type":"error","code":str,"message":str}.

Library use:

    import ie_client
    done = ie_client.generate("tcp://127.0.0.1:5556", prompt="Hi", max_new=16,
                              temperature=0.0)
    print(done["text"])
    for ev in ie_client.stream("tcp://127.0.0.1:5556", prompt="Hi"):
        ...                                 # token events, then the done map

CURVE: pass curve=CurveKeys(server_public=..., public=..., secret=...) (Z85
text, or load them from ie-keygen files with CurveKeys.from_files).

CLI:

    python apps/clients/ie_client.py --endpoint tcp://127.0.0.1:5556 \
        --prompt "The capital of France is" [--stream] [--max-new N] [--greedy]

Exit codes of the CLI: 0 done, 1 error reply, 3 timeout, 2 bad usage.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from dataclasses import dataclass
from typing import Iterator, Optional

import msgpack
import zmq

PROTO_VERSION = 1
DEFAULT_TIMEOUT_S = 120.0


class ClientError(Exception):
    """An error reply from the coordinator, or a local failure.

    code: the reply's "code" ("invalid_request", "unavailable", "busy", ...),
          or "timeout" when nothing (more) arrived in time.
    message: the reply's human-readable text."""

    def __init__(self, code: str, message: str, reply: Optional[dict] = None):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.reply = reply


class ClientTimeout(ClientError):
    def __init__(self, message: str):
        super().__init__("timeout", message)


@dataclass
class CurveKeys:
    server_public: str      # the coordinator's public key (Z85)
    public: str             # this client's key pair (Z85)
    secret: str

    @staticmethod
    def _read(path: str) -> str:
        with open(path, "r", encoding="ascii") as f:
            k = f.read().strip()
        if len(k) != 40:
            raise ValueError(f"{path}: not a Z85 CURVE key (40 characters)")
        return k

    @classmethod
    def from_files(cls, server_pub: str, keys_dir: str, name: str) -> "CurveKeys":
        return cls(cls._read(server_pub), cls._read(os.path.join(keys_dir, name + ".pub")),
                   cls._read(os.path.join(keys_dir, name + ".key")))


def build_request(prompt: Optional[str] = None, messages: Optional[list] = None,
                  stream: bool = False, req_id: Optional[str] = None, **params) -> dict:
    if (prompt is None) == (messages is None):
        raise ValueError("give exactly one of prompt and messages")
    req = {"v": PROTO_VERSION, "type": "generate", "id": req_id or uuid.uuid4().hex[:16],
           "stream": bool(stream)}
    if prompt is not None:
        req["prompt"] = prompt
    else:
        req["messages"] = [{"role": m["role"], "content": m["content"]} for m in messages]
    for k, v in params.items():
        if v is not None:
            req[k] = v
    return req


class Connection:
    """One DEALER socket connected to the coordinator's client endpoint."""

    def __init__(self, endpoint: str, curve: Optional[CurveKeys] = None,
                 ctx: Optional[zmq.Context] = None):
        self._own_ctx = ctx is None
        self.ctx = ctx or zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        if "[" in endpoint:  # an IPv6 literal (tcp://[::1]:5556): libzmq sockets are IPv4-only by default
            self.sock.setsockopt(zmq.IPV6, 1)
        if curve is not None:
            self.sock.curve_serverkey = curve.server_public.encode()
            self.sock.curve_publickey = curve.public.encode()
            self.sock.curve_secretkey = curve.secret.encode()
        self.sock.connect(endpoint)

    def close(self) -> None:
        self.sock.close(0)
        if self._own_ctx:
            self.ctx.term()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def send(self, obj) -> None:
        """Send a map (packed here) or raw bytes as one frame."""
        data = obj if isinstance(obj, (bytes, bytearray)) else msgpack.packb(obj, use_bin_type=True)
        self.sock.send(data)

    def recv(self, timeout_s: float) -> dict:
        """One reply map; ClientTimeout when nothing arrives in time."""
        if not self.sock.poll(int(max(0.0, timeout_s) * 1000)):
            raise ClientTimeout(f"no reply within {timeout_s:.1f} s")
        frames = self.sock.recv_multipart()
        # a DEALER may see an empty delimiter frame first; the map is the last frame
        obj = msgpack.unpackb(frames[-1], raw=False)
        if not isinstance(obj, dict):
            raise ClientError("protocol", f"reply is not a map: {obj!r}")
        return obj

    def events(self, req: dict, timeout_s: float = DEFAULT_TIMEOUT_S,
               idle_timeout_s: Optional[float] = None) -> Iterator[dict]:
        """Send req, yield its replies up to and including the done map.
        timeout_s bounds the whole request, idle_timeout_s (default: timeout_s)
        the gap between two replies. An error reply raises ClientError."""
        self.send(req)
        deadline = time.monotonic() + timeout_s
        idle = timeout_s if idle_timeout_s is None else idle_timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ClientTimeout(f"request {req.get('id')} not done within {timeout_s:.1f} s")
            rep = self.recv(min(left, idle))
            if rep.get("id") not in (None, "", req.get("id")):
                continue  # a late reply to an earlier request on this socket
            t = rep.get("type")
            if t == "error":
                raise ClientError(str(rep.get("code", "internal")), str(rep.get("message", "")), rep)
            yield rep
            if t == "done":
                return


def stream(endpoint: str, prompt: Optional[str] = None, messages: Optional[list] = None,
           timeout_s: float = DEFAULT_TIMEOUT_S, curve: Optional[CurveKeys] = None,
           idle_timeout_s: Optional[float] = None, **params) -> Iterator[dict]:
    """Yield the token events of a streamed request, then the done map."""
    req = build_request(prompt, messages, stream=True, **params)
    with Connection(endpoint, curve) as c:
        yield from c.events(req, timeout_s, idle_timeout_s)


def generate(endpoint: str, prompt: Optional[str] = None, messages: Optional[list] = None,
             stream: bool = False, timeout_s: float = DEFAULT_TIMEOUT_S,
             curve: Optional[CurveKeys] = None, on_token=None, **params) -> dict:
    """Run one request; returns the done map. With stream=True the token
    events are passed to on_token(event) (when given) as they arrive and the
    done map gets an extra key "events" listing them. Raises ClientError on an
    error reply, ClientTimeout when the answer does not come in time."""
    req = build_request(prompt, messages, stream=stream, **params)
    evs = []
    with Connection(endpoint, curve) as c:
        for ev in c.events(req, timeout_s):
            if ev.get("type") == "done":
                if stream:
                    ev["events"] = evs
                return ev
            evs.append(ev)
            if on_token is not None:
                on_token(ev)
    raise ClientError("protocol", "reply stream ended without done")  # not reached


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="send one generate request to an ie-coordinator")
    ap.add_argument("--endpoint", required=True, help="the coordinator's client endpoint (tcp://host:port)")
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--prompt", help="raw prompt text")
    g.add_argument("--user", help="one user chat message (rendered with the model's template)")
    ap.add_argument("--stream", action="store_true", help="print tokens as they arrive")
    ap.add_argument("--max-new", type=int, default=None)
    ap.add_argument("--greedy", action="store_true", help="temperature 0")
    ap.add_argument("--temperature", type=float, default=None)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--priority", type=int, default=None)
    ap.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds (120)")
    ap.add_argument("--json", action="store_true", help="print the done map as JSON (after the text)")
    ap.add_argument("--server-key", help="CURVE: the coordinator's .pub file")
    ap.add_argument("--keys-dir", help="CURVE: directory of this client's key pair")
    ap.add_argument("--key", help="CURVE: name of this client's key pair")
    a = ap.parse_args(argv)

    curve = None
    if a.server_key or a.keys_dir or a.key:
        if not (a.server_key and a.keys_dir and a.key):
            ap.error("CURVE needs --server-key, --keys-dir and --key together")
        curve = CurveKeys.from_files(a.server_key, a.keys_dir, a.key)
    temperature = 0.0 if a.greedy else a.temperature
    messages = [{"role": "user", "content": a.user}] if a.user is not None else None

    def on_token(ev):
        sys.stdout.write(ev.get("text", ""))
        sys.stdout.flush()

    try:
        done = generate(a.endpoint, prompt=a.prompt, messages=messages, stream=a.stream,
                        timeout_s=a.timeout, curve=curve, on_token=on_token if a.stream else None,
                        max_new=a.max_new, temperature=temperature, seed=a.seed, priority=a.priority)
    except ClientTimeout as e:
        print(f"\nerror: {e.message}", file=sys.stderr)
        return 3
    except ClientError as e:
        print(f"\nerror: {e.code}: {e.message}", file=sys.stderr)
        return 1
    if not a.stream:
        sys.stdout.write(done.get("text", ""))
    sys.stdout.write("\n")
    if a.json:
        import json
        done.pop("events", None)
        print(json.dumps(done))
    print(f"[{done.get('finish')}: {done.get('n_prompt')} prompt + {done.get('n_gen')} generated tokens, "
          f"ttft {done.get('ttft_ms', 0):.1f} ms, {done.get('decode_tps', 0):.1f} tok/s]", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
