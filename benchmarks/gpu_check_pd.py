"""A prefill and a decode `vllm serve` on one GPU, unlike block sizes (or layouts), moving KV
through HisparsePlanConnector: one prepared script, well under 8 minutes (docs/connector.md).

    python benchmarks/gpu_check_pd.py [--dry-run] [--config tests/hf_configs/NAME/config.json]
        [--prefill-block 16] [--decode-block 64] [--prefill-layout L] [--decode-layout L]
    python benchmarks/gpu_check_pd.py proxy --prefill URL --decode URL [--port 8000]

Run from the repository root with vLLM 0.34 (CUDA), nixl-cu12 and this project importable
(the servers import the connector by `kv_connector_module_path`; the script puts src/ on
their PYTHONPATH). Steps:

1. The model: a small config from tests/hf_configs (default smollm3-small: 4 Llama-like
   layers, 2 KV heads) copied into a folder, served with `--load-format dummy` (vLLM's dummy
   weights are seeded, so every instance holds the same weights) and `--skip-tokenizer-init`
   (prompts and answers are token ids).
2. Plans: each side planned with this project for its block size and layout; the pattern
   between them compiled and proved (`compile_transfer`, `check_pattern`), and the bytes a
   prompt of each length moves computed from it.
3. Three servers, started one after another on one GPU (`--gpu-memory-utilization` split):
   the prefill and the decode with `--kv-transfer-config` loading this connector (each with
   its own side channel port), and a baseline with the decode's settings and no connector.
4. The proxy (this script's own, vLLM's toy proxy is not in the wheel: it asks the prefill
   for one token with `kv_transfer_params` {"do_remote_decode": true}, then hands the
   prefill's `kv_transfer_params`, the ticket, to the decode with the original request).
5. The prompts (seeded token ids, several lengths), greedy, through the proxy and on the
   baseline: the same token ids; each transfer's bytes and time from the decode's log line
   (`hisparse_plan: pulled REQ: N bytes in T ms`) against the bytes of step 2.

`--dry-run` runs on CPU without vLLM: it reads the config, plans both sides, compiles and
proves the pair, validates the kv-transfer-config with the connector's own settings reader
(and with vLLM's KVTransferConfig where vLLM imports), and prints the command lines. Exit 0
when every check holds, 1 at the first failure.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = ROOT / "tests" / "hf_configs" / "smollm3-small" / "config.json"
MODEL_NAME = "tiny"
LENGTHS = (17, 128, 513, 1000, 1900)
"""Prompt tokens: under one block, a few blocks, across 16- and 64-token block edges, long."""
PULLED = re.compile(r"hisparse_plan: pulled (\S+): (\d+) bytes in ([0-9.]+) ms")
LAYOUTS = ("LBNHC", "LBHNC", "BLHNC", "BLNHC")


class CheckFailed(Exception):
    """One check of the script does not hold."""


@dataclass(frozen=True)
class Role:
    """One `vllm serve` of the check."""

    name: str
    port: int
    block_size: int
    layout: str | None
    side_channel_port: int | None
    """None: no connector (the baseline)."""
    memory_fraction: float


def transfer_config(role: Role) -> dict[str, Any]:
    """The --kv-transfer-config that loads HisparsePlanConnector for `role`."""
    assert role.side_channel_port is not None
    return {"kv_connector": "HisparsePlanConnector",
            "kv_connector_module_path": "hisparse_plan.connectors.vllm",
            "kv_role": "kv_both",
            "kv_connector_extra_config": {"instance_id": role.name,
                                          "side_channel_port": role.side_channel_port}}


def serve_command(role: Role, model: Path, max_model_len: int) -> list[str]:
    """The role's `vllm serve` line (as `python -m vllm.entrypoints.cli.main serve`)."""
    command = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", str(model),
               "--served-model-name", MODEL_NAME, "--load-format", "dummy",
               "--skip-tokenizer-init", "--enforce-eager", "--port", str(role.port),
               "--block-size", str(role.block_size), "--max-model-len", str(max_model_len),
               "--gpu-memory-utilization", str(role.memory_fraction), "--seed", "0",
               "--max-num-seqs", "8"]
    if role.side_channel_port is not None:
        command += ["--kv-transfer-config", json.dumps(transfer_config(role))]
    return command


def serve_env(role: Role, logging_config: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT / "src"), *filter(None, [env.get("PYTHONPATH")])])
    env["VLLM_LOGGING_CONFIG_PATH"] = str(logging_config)
    if role.layout is not None:
        env["VLLM_KV_CACHE_LAYOUT"] = role.layout
    return env


def logging_config() -> dict[str, Any]:
    """vLLM's own loggers at INFO, and the connector's (the pulled line) beside them."""
    handler = {"class": "logging.StreamHandler", "stream": "ext://sys.stdout",
               "formatter": "plain"}
    return {"version": 1, "disable_existing_loggers": False,
            "formatters": {"plain": {"format": "%(levelname)s %(asctime)s %(name)s: "
                                               "%(message)s"}},
            "handlers": {"out": handler},
            "loggers": {"vllm": {"handlers": ["out"], "level": "INFO", "propagate": False},
                        "hisparse_plan": {"handlers": ["out"], "level": "INFO",
                                          "propagate": False}}}


def shell_line(command: Sequence[str], env: dict[str, str] | None = None) -> str:
    import shlex

    prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in (env or {}).items())
    return (prefix + " " if prefix else "") + " ".join(shlex.quote(part) for part in command)


# -- the plans (CPU) ---------------------------------------------------------------------------


@dataclass
class Planned:
    prefill: Any
    decode: Any
    pattern: Any
    bytes_per_length: dict[int, int] = field(default_factory=dict)


def plan_pair(config: Path, prefill: Role, decode: Role, max_model_len: int,
              lengths: Sequence[int], use_transformers: bool = True) -> Planned:
    """Both sides planned with this project, the pattern between them compiled and proved, the
    bytes of a prompt of each length (the tokens the prefill computed: the prompt's)."""
    import hisparse_plan as hp
    from hisparse_plan.exchange.transfer import (
        Instance,
        TransferRequest,
        check_pattern,
        compile_transfer,
        tables,
    )
    from hisparse_plan.models import KVCacheLayout
    from hisparse_plan.presets import Settings, build_request
    from hisparse_plan.presets.config_file import load_config_file

    architecture = load_config_file(config, use_transformers=use_transformers)
    plans = []
    for role in (prefill, decode):
        settings = Settings(block_size=role.block_size, max_model_len=max_model_len,
                            gpu_mem_bytes=2**30,
                            layout=None if role.layout is None else KVCacheLayout(role.layout))
        plans.append(hp.plan(build_request(architecture, settings)))
    heads = json.loads(config.read_text()).get("num_key_value_heads")
    src = Instance([plans[0]], total_kv_heads=heads)
    dst = Instance([plans[1]], total_kv_heads=heads)
    pattern = compile_transfer(src, dst)
    check_pattern(pattern, src, dst)
    found = Planned(plans[0], plans[1], pattern)
    for length in lengths:
        blocks = {}
        for side, plan in (("source", plans[0]), ("destination", plans[1])):
            blocks[side] = {name: list(range(1, 1 + -(-length // table.block_tokens)))
                            for name, table in tables(plan).items()}
        request = TransferRequest(num_tokens=length, source_blocks=blocks["source"],
                                  destination_blocks=blocks["destination"])
        found.bytes_per_length[length] = pattern.instantiate(request).bytes
    return found


def check_transfer_config(role: Role) -> list[str]:
    """The connector's settings reader on the role's config (and vLLM's, where it imports);
    the checks that ran."""
    from hisparse_plan.connectors.vllm.settings import settings_of

    data = transfer_config(role)
    transfer = SimpleNamespace(kv_connector_extra_config=data["kv_connector_extra_config"],
                               engine_id=role.name)
    settings = settings_of(SimpleNamespace(kv_transfer_config=transfer))
    if settings.side_channel_port != role.side_channel_port or settings.instance_id != role.name:
        raise CheckFailed(f"{role.name}: the connector reads {settings}; expected port "
                          f"{role.side_channel_port} and instance {role.name}")
    ran = [f"{role.name}: kv_connector_extra_config read by the connector's settings_of"]
    try:
        from vllm.config import KVTransferConfig  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        return ran
    made = KVTransferConfig(**data)
    if made.kv_connector_module_path != data["kv_connector_module_path"]:
        raise CheckFailed(f"{role.name}: vLLM's KVTransferConfig lost the module path")
    ran.append(f"{role.name}: the config accepted by vLLM's KVTransferConfig")
    return ran


# -- the proxy ---------------------------------------------------------------------------------


@dataclass
class Record:
    """One request through the proxy: the prefill's and the decode's wall time."""

    prefill_s: float
    decode_s: float
    ticket: dict[str, Any] | None


def post_json(url: str, body: dict[str, Any], timeout: float = 120.0) -> dict[str, Any]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as answer:
        found: dict[str, Any] = json.loads(answer.read())
    return found


def through_pair(prefill_url: str, decode_url: str, body: dict[str, Any]
                 ) -> tuple[dict[str, Any], Record]:
    """What vLLM's toy proxy does for one completion: one token on the prefill asking for a
    remote decode, then the request on the decode with the prefill's kv_transfer_params."""
    first = dict(body, max_tokens=1, stream=False,
                 kv_transfer_params={"do_remote_decode": True, "do_remote_prefill": False})
    first.pop("min_tokens", None)
    at = time.perf_counter()
    answer = post_json(f"{prefill_url}/v1/completions", first)
    middle = time.perf_counter()
    params = answer.get("kv_transfer_params")
    second = dict(body, kv_transfer_params=params)
    final = post_json(f"{decode_url}/v1/completions", second)
    return final, Record(middle - at, time.perf_counter() - middle, params)


class Proxy:
    """A minimal P/D proxy on loopback: POST /v1/completions (non-streaming)."""

    def __init__(self, prefill_url: str, decode_url: str, port: int) -> None:
        records: list[Record] = []
        self.records = records

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                if self.path != "/v1/completions":
                    self.send_error(404, "only /v1/completions")
                    return
                size = int(self.headers.get("Content-Length", "0"))
                try:
                    body = json.loads(self.rfile.read(size))
                    answer, record = through_pair(prefill_url, decode_url, body)
                except (ValueError, urllib.error.URLError) as error:
                    self.send_error(502, str(error))
                    return
                records.append(record)
                data = json.dumps(answer).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: ANN401
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# -- the GPU run -------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_healthy(role: Role, process: subprocess.Popen[bytes], log: Path,
                 deadline: float) -> None:
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = log.read_text(errors="replace")[-4000:]
            raise CheckFailed(f"{role.name} exited with {process.returncode}:\n{tail}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{role.port}/health",
                                        timeout=2) as answer:
                if answer.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(1.0)
    raise CheckFailed(f"{role.name} not healthy before the deadline; see {log}")


def prompts(count: int, seed: int, vocab: int) -> list[list[int]]:
    rng = random.Random(seed)
    lengths = (LENGTHS * (1 + count // len(LENGTHS)))[:count]
    return [[rng.randrange(100, min(vocab, 30000)) for _ in range(n)] for n in lengths]


def completion(prompt: list[int], max_tokens: int) -> dict[str, Any]:
    return {"model": MODEL_NAME, "prompt": prompt, "max_tokens": max_tokens,
            "temperature": 0.0, "return_token_ids": True, "ignore_eos": True}


def token_ids(answer: dict[str, Any]) -> list[int]:
    choice = answer["choices"][0]
    found = choice.get("token_ids")
    if found is None:
        raise CheckFailed(f"the answer carries no token_ids: {json.dumps(answer)[:400]}")
    return [int(token) for token in found]


def run_gpu(args: argparse.Namespace, roles: dict[str, Role], planned: Planned,
            model: Path, folder: Path) -> None:
    started = time.monotonic()
    deadline = started + args.timeout
    config_path = folder / "logging.json"
    config_path.write_text(json.dumps(logging_config()))
    processes: list[subprocess.Popen[bytes]] = []
    logs = {}
    proxy = None
    try:
        for name in ("prefill", "decode", "baseline"):
            role = roles[name]
            logs[name] = folder / f"{name}.log"
            with open(logs[name], "wb") as out:
                process = subprocess.Popen(serve_command(role, model, args.max_model_len),
                                           env=serve_env(role, config_path), cwd=ROOT,
                                           stdout=out, stderr=subprocess.STDOUT)
            processes.append(process)
            wait_healthy(role, process, logs[name], deadline)
            print(f"{name} up after {time.monotonic() - started:.0f} s "
                  f"(block {role.block_size}, layout {role.layout or 'default'})", flush=True)
        urls = {name: f"http://127.0.0.1:{role.port}" for name, role in roles.items()}
        proxy = Proxy(urls["prefill"], urls["decode"], 0)
        vocab = int(json.loads(model.joinpath("config.json").read_text())["vocab_size"])
        failures = 0
        for index, prompt in enumerate(prompts(args.prompts, args.seed, vocab)):
            body = completion(prompt, args.max_tokens)
            pd = token_ids(post_json(f"{proxy.url}/v1/completions", body))
            record = proxy.records[-1]
            alone = token_ids(post_json(f"{urls['baseline']}/v1/completions", body))
            same = pd == alone
            failures += not same
            expected = planned.bytes_per_length.get(len(prompt))
            print(f"prompt {index}: {len(prompt)} tokens, {len(pd)} generated, "
                  f"{'identical' if same else 'DIFFERENT'} tokens "
                  f"(prefill {1e3 * record.prefill_s:.1f} ms, decode {1e3 * record.decode_s:.1f}"
                  f" ms; the plan moves {expected} bytes)", flush=True)
            if not same:
                at = next((i for i, (a, b) in enumerate(zip(pd, alone, strict=False))
                           if a != b), min(len(pd), len(alone)))
                print(f"  first difference at token {at}: P/D {pd[at:at + 4]}, one instance "
                      f"{alone[at:at + 4]}")
        time.sleep(1.0)  # the decode's last log lines
        pulled = PULLED.findall(logs["decode"].read_text(errors="replace"))
        for request, size, ms in pulled:
            print(f"transfer {request}: {int(size):,} bytes in {float(ms):.3f} ms "
                  f"({int(size) / max(float(ms), 1e-6) / 1e6:.2f} GB/s)")
        lengths = sorted(len(p) for p in prompts(args.prompts, args.seed, vocab))
        moved = sorted(int(size) for _, size, _ in pulled)
        planned_bytes = sorted(planned.bytes_per_length[n] for n in lengths)
        if moved != planned_bytes:
            failures += 1
            print(f"bytes moved {moved}; the plans give {planned_bytes}")
        print(f"whole check {time.monotonic() - started:.0f} s; "
              f"{'PASS' if failures == 0 else f'FAIL ({failures})'}")
        if failures:
            raise CheckFailed(f"{failures} check(s) failed; logs in {folder}")
    finally:
        if proxy is not None:
            proxy.close()
        for process in reversed(processes):
            process.terminate()
        for process in processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()


# -- entry -------------------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    made = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    made.add_argument("--dry-run", action="store_true",
                      help="CPU only: plan, prove, validate and print the command lines")
    made.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    made.add_argument("--no-transformers", action="store_true",
                      help="read the config without transformers' config class (faster; a "
                      "config that leaves a field to transformers' defaults is refused)")
    made.add_argument("--prefill-block", type=int, default=16)
    made.add_argument("--decode-block", type=int, default=64)
    made.add_argument("--prefill-layout", choices=LAYOUTS, default=None,
                      help="VLLM_KV_CACHE_LAYOUT of the prefill (default: the backend's)")
    made.add_argument("--decode-layout", choices=LAYOUTS, default=None)
    made.add_argument("--gpu-memory-utilization", type=float, default=0.25,
                      help="each of the three servers' share of the GPU")
    made.add_argument("--max-model-len", type=int, default=2048)
    made.add_argument("--max-tokens", type=int, default=16)
    made.add_argument("--prompts", type=int, default=len(LENGTHS))
    made.add_argument("--seed", type=int, default=0)
    made.add_argument("--timeout", type=float, default=450.0,
                      help="seconds for the whole GPU run")
    made.add_argument("--workdir", type=Path, default=None,
                      help="model folder and logs (default: a temporary folder)")
    return made


def proxy_main(argv: Sequence[str]) -> None:
    made = argparse.ArgumentParser(description="A minimal P/D proxy (vLLM's toy proxy's "
                                   "flow): POST /v1/completions")
    made.add_argument("--prefill", required=True, help="e.g. http://127.0.0.1:8100")
    made.add_argument("--decode", required=True, help="e.g. http://127.0.0.1:8200")
    made.add_argument("--port", type=int, default=8000)
    args = made.parse_args(argv)
    proxy = Proxy(args.prefill.rstrip("/"), args.decode.rstrip("/"), args.port)
    print(f"proxy on {proxy.url}", flush=True)
    try:
        proxy.thread.join()
    except KeyboardInterrupt:
        proxy.close()


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["proxy"]:
        proxy_main(argv[1:])
        return 0
    from hisparse_plan.errors import PlanError

    args = parser().parse_args(argv)
    share = args.gpu_memory_utilization
    if not 0 < share <= 0.33:
        print(f"--gpu-memory-utilization {share}: expected a share in (0, 0.33], three "
              "servers share the GPU")
        return 1
    roles = {
        "prefill": Role("prefill", free_port(), args.prefill_block, args.prefill_layout,
                        free_port(), share),
        "decode": Role("decode", free_port(), args.decode_block, args.decode_layout,
                       free_port(), share),
        "baseline": Role("baseline", free_port(), args.decode_block, args.decode_layout,
                         None, share),
    }
    started = time.monotonic()
    try:
        lengths = [len(p) for p in prompts(args.prompts, args.seed, 2**31)]
        planned = plan_pair(args.config, roles["prefill"], roles["decode"],
                            args.max_model_len, lengths, not args.no_transformers)
        print(f"plans: prefill block {args.prefill_block} {planned.prefill.device_pool.layout},"
              f" decode block {args.decode_block} {planned.decode.device_pool.layout}; pattern "
              f"compiled and proved ({len(planned.pattern.rows)} rows)")
        for length, size in sorted(planned.bytes_per_length.items()):
            print(f"  a {length}-token prompt moves {size:,} bytes")
        for name in ("prefill", "decode"):
            for line in check_transfer_config(roles[name]):
                print(f"checked: {line}")
        folder = args.workdir or Path(tempfile.mkdtemp(prefix="gpu_check_pd_"))
        model = folder / "model"
        model.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(args.config, model / "config.json")
        config_path = folder / "logging.json"
        for name, role in roles.items():
            env = {"PYTHONPATH": str(ROOT / "src"), "VLLM_LOGGING_CONFIG_PATH": str(config_path)}
            if role.layout is not None:
                env["VLLM_KV_CACHE_LAYOUT"] = role.layout
            print(f"{name}: {shell_line(serve_command(role, model, args.max_model_len), env)}")
        urls = [f"http://127.0.0.1:{roles[name].port}" for name in ("prefill", "decode")]
        proxy = [sys.executable, str(Path(__file__).resolve()), "proxy", "--prefill", urls[0],
                 "--decode", urls[1]]
        print(f"proxy: {shell_line(proxy)}")
        if args.dry_run:
            print(f"dry run: every check holds ({time.monotonic() - started:.1f} s)")
            return 0
        run_gpu(args, roles, planned, model, folder)
    except (CheckFailed, PlanError) as error:
        print(f"FAIL: {error}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
