"""Server settings. With no model the server runs the embedded tiny hybrid model, so it needs no download.

>>> ServerConfig(port=0).host
'127.0.0.1'
>>> ServerConfig(port=70000)
Traceback (most recent call last):
...
ValueError: port must be in 0..65535, got 70000
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["ServerConfig", "max_threads", "key_name", "MAX_API_KEYS", "MAX_KEY_CHARS"]

MAX_API_KEYS = 4096
MAX_KEY_CHARS = 4096


def key_name(key: str) -> str:
    """The name an unnamed API key goes by in logs and errors: a short hash, never the key.

    >>> key_name("s3cret")
    'key-1ec1c26b'
    """
    import hashlib

    return "key-" + hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:8]


def key_pair_problem(name: str, key: str, names: set, keys: set, *, earlier: str) -> str | None:
    """What is wrong with one (name, key) among those already seen (None: nothing; then both are added to
    `names` and `keys`). The one rule for `--api-key-file` lines and `ServerConfig.api_keys`; the message never
    shows the key."""
    if not key or len(key) > MAX_KEY_CHARS or any(c.isspace() or not c.isprintable() for c in key):
        return f"a key is 1..{MAX_KEY_CHARS} printable characters without spaces"
    if not name or len(name) > 64 or any(c.isspace() or not c.isprintable() for c in name):
        return "a name is 1..64 printable characters without spaces"
    if name in names:
        return f"the name {name!r} is given twice"
    if key in keys:
        return f"the same key as an earlier {earlier}"
    names.add(name)
    keys.add(key)
    return None


def max_threads() -> int:
    """The most engine threads a server accepts: 4 per core (more only thrashes; far more kills the process)."""
    return 4 * (os.cpu_count() or 1)


@dataclass
class ServerConfig:
    model: str | None = None          # model folder; None = strata_lab.tiny.embedded_model('hybrid')
    host: str = "127.0.0.1"
    port: int = 8080
    dump: str | None = None           # strata-dump/1 file; None = $STRATA_PROMPT_DUMP if set
    api_key: str | None = field(default=None, repr=False)    # one key (named by its hash: key_name)
    # (name, key) pairs (--api-key-file): any of them is accepted; the concurrency limit counts per key
    api_keys: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    max_context: int = 4096
    threads: int = 0                  # 0 = the engine's default
    kv_cache: str = "auto"            # the sessions' attention KV caches: Engine.load's kv_cache (auto|f32|f16|q8)
    reply_reuse: bool = True          # PromptEncoder.remember_reply after each request
    max_body_bytes: int = 4 * 1024 * 1024
    template: str = "qwen3"             # a preset name, or a .jinja / tokenizer_config.json / model folder path
    model_name: str | None = None
    session: str = "default"
    stop_latency: int = 0             # engine steps a STOP takes to land (production engines: 1-3)
    # also checkpoint before the generation prompt's header (the last <|im_start|> of each prompt): on a
    # hybrid model it serves the next prompt when the template strips the previous reply's <think> block
    header_checkpoint: bool = True
    allowed_hosts: tuple[str, ...] = ()   # Host names answered besides the bound address (DNS rebinding guard)
    cors_origins: tuple[str, ...] = ()    # browser origins allowed cross-origin (CORS is off without them)
    body_timeout: float = 30.0            # seconds a request body may take to arrive (408 after)
    keep_alive_timeout: float = 5.0       # seconds an idle keep-alive connection is held
    max_tokens_default: int = 1024        # output cap when a request names none (OpenAI max_tokens absent/null)
    no_mmap: bool = False                 # read the weights into memory instead of mapping the file
    check_weights: bool = False           # refuse weights holding NaN or infinity (one pass over them)
    slots: int = 1                    # engine sessions; requests pick one (id_slot, session key, LCP, LRU)
    slot_similarity: float = 0.5      # a slot whose held ids cover more than this share of the prompt wins
    # constrained decoding bounds a schema's unbounded strings / arrays (grammar.bound_schema; None: off)
    grammar_max_string: int | None = 256
    grammar_max_items: int | None = 16
    # CPU-heavy request work (cpu.py): threads for large bodies, schema checks and grammar compiles, how many
    # more may wait, and each one's time budget (503 after)
    cpu_workers: int = 2
    cpu_queue: int = 8
    cpu_timeout: float = 120.0
    max_client_requests: int = 16     # requests one API key (no key required: one address) may have in flight
    # isolation by API key (docs/SECURITY.md): a slot's cached prompt serves only the key that sent it, unless
    # shared_cache (--shared-cache) lets all keys share one cache (as without keys); stored /v1/responses are
    # always per key: at most response_store of them and response_store_bytes of their JSON, each for
    # response_ttl seconds
    shared_cache: bool = False
    response_store: int = 256
    response_store_bytes: int = 64 * 1024 * 1024
    response_ttl: float = 3600.0
    seed: int | None = None           # the sampler seed of a request that names none (None: a fresh one each)

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in 0..65535, got {self.port}")
        if self.max_context < 16:
            raise ValueError(f"max_context must be >= 16, got {self.max_context}")
        if self.max_body_bytes < 1024:
            raise ValueError(f"max_body_bytes must be >= 1024, got {self.max_body_bytes}")
        if self.stop_latency < 0:
            raise ValueError(f"stop_latency must be >= 0, got {self.stop_latency}")
        if not 1 <= self.slots <= 64:
            raise ValueError(f"slots must be in 1..64, got {self.slots}")
        if not 0.0 <= self.slot_similarity <= 1.0:
            raise ValueError(f"slot_similarity must be in [0, 1], got {self.slot_similarity}")
        if self.threads < 0:
            raise ValueError(f"threads must be >= 0, got {self.threads}")
        from strata_lab.engine import KV_CACHES

        if not isinstance(self.kv_cache, str) or self.kv_cache not in KV_CACHES:
            raise ValueError(f"kv_cache must be one of {', '.join(KV_CACHES)}, got {self.kv_cache!r}")
        if self.threads > max_threads():
            raise ValueError(f"threads must be <= {max_threads()} (4 x {os.cpu_count()} cores), got {self.threads}")
        if not 0 < self.body_timeout <= 3600:
            raise ValueError(f"body_timeout must be in (0, 3600] seconds, got {self.body_timeout}")
        if not 0 < self.keep_alive_timeout <= 3600:
            raise ValueError(f"keep_alive_timeout must be in (0, 3600] seconds, got {self.keep_alive_timeout}")
        for name in ("grammar_max_string", "grammar_max_items"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be >= 1 (or unset for unbounded), got {value!r}")
        if not 1 <= self.cpu_workers <= 64:
            raise ValueError(f"cpu_workers must be in 1..64, got {self.cpu_workers}")
        if not 0 <= self.cpu_queue <= 1024:
            raise ValueError(f"cpu_queue must be in 0..1024, got {self.cpu_queue}")
        if not 0 < self.cpu_timeout <= 3600:
            raise ValueError(f"cpu_timeout must be in (0, 3600] seconds, got {self.cpu_timeout}")
        if not 1 <= self.max_client_requests <= 4096:
            raise ValueError(f"max_client_requests must be in 1..4096, got {self.max_client_requests}")
        if not 0 <= self.response_store <= 1_000_000:
            raise ValueError(f"response_store must be in 0..1000000, got {self.response_store}")
        if not 0 <= self.response_store_bytes <= 1 << 40:
            raise ValueError(f"response_store_bytes must be in 0..2**40, got {self.response_store_bytes}")
        if not 0 < self.response_ttl <= 30 * 86400:
            raise ValueError(f"response_ttl must be in (0, 2592000] seconds, got {self.response_ttl}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)
                                      or not 0 <= self.seed < 2**64):
            raise ValueError(f"seed (--seed) must be an integer in 0..2**64-1, got {self.seed!r}")
        if self.max_tokens_default < 1:
            raise ValueError(f"max_tokens_default must be >= 1, got {self.max_tokens_default}")
        self.allowed_hosts, self.cors_origins = tuple(self.allowed_hosts), tuple(self.cors_origins)
        for host in self.allowed_hosts:   # a Host header value: a name or address[:port], nothing else
            if not isinstance(host, str) or not host or len(host) > 255 or \
                    any(c.isspace() or not c.isprintable() or c in "/\\@?#," for c in host):
                raise ValueError(f"allowed_hosts (--allowed-host) must hold host names like app.example or "
                                 f"10.0.0.5:8080, got {host!r}")
        if self.model_name is not None and (not isinstance(self.model_name, str) or not self.model_name.strip()
                                            or len(self.model_name) > 256
                                            or any(not c.isprintable() for c in self.model_name)):
            raise ValueError(f"model_name (--alias) must be a non-empty name of printable characters (at most 256), "
                             f"got {str(self.model_name)[:60]!r}")
        for origin in self.cors_origins:
            if origin == "*" or "://" not in origin or origin.endswith("/"):
                raise ValueError(f"cors_origins must hold origins like https://app.example (no '*', no path), "
                                 f"got {origin!r}")
        if self.dump is not None and not self.dump:
            raise ValueError("dump must name a file (leave it unset to record nothing)")
        if self.api_key == "":
            raise ValueError("api_key must not be empty (leave it unset for no key)")
        self.api_keys = tuple(tuple(pair) for pair in self.api_keys)
        if len(self.api_keys) > MAX_API_KEYS:
            raise ValueError(f"api_keys: at most {MAX_API_KEYS} keys, got {len(self.api_keys)}")
        names, keys = set(), set()
        for i, pair in enumerate(self.api_keys):  # messages name the key by its place, never show it
            if len(pair) != 2 or not all(isinstance(x, str) for x in pair):
                raise ValueError(f"api_keys[{i}] must be a (name, key) pair of strings")
            problem = key_pair_problem(*pair, names, keys, earlier="one")
            if problem:
                raise ValueError(f"api_keys[{i}]: {problem}")
        if self.model is not None and not Path(self.model).is_dir():
            raise ValueError(f"model must be a model directory, {self.model!r} is not one")

    def keys(self) -> dict[str, str]:
        """Every accepted key -> its name (api_key under its hash name, then api_keys); empty: no key required."""
        out = {self.api_key: key_name(self.api_key)} if self.api_key else {}
        for name, key in self.api_keys:
            out.setdefault(key, name)
        return out
