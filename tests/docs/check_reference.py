#!/usr/bin/env python3
"""Keeps docs/reference/ true to the binaries and the source.

  settings.md  lists exactly the keys `stitch-node --print-config` prints, each
               with the default it prints;
  cli.md       has a `## stitch <command>` section for exactly the commands
               `stitch --help` lists, and the exit codes 0, 1 and 2;
  metrics.md   lists exactly the metric names the source emits, and a live
               node's /metrics (its status surface, after a publish and a
               request) shows no name it does not list;
  http.md      documents only routes whose paths the source serves, and every
               route of DESIGN §5.

usage: check_reference.py --repo DIR --bin DIR
"""

import argparse
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

SOURCE_DIRS = ["actors", "node", "transport", "runtime", "gpu", "config"]
SOURCE_EXT = (".cpp", ".hpp", ".cu")
# Every route DESIGN §5 names must be documented.
CONTRACT_ROUTES = [
    "POST /generate", "POST /v1/completions", "POST /v1/chat/completions", "GET /health",
    "GET /server_info", "POST /wake", "GET /pool", "GET /status", "GET /metrics", "GET /",
    "POST /publish",
]
METRIC = re.compile(r'"(stitch_[a-z0-9_]+)')

problems = []


def problem(text):
    problems.append(text)


def tables(path, header):
    """The rows (lists of cells) of every table of `path` whose header row's
    cells are `header`."""
    rows, inside = [], False
    if not os.path.exists(path):
        problem(f"{os.path.relpath(path)} is missing")
        return rows
    for line in open(path, encoding="utf-8"):
        line = line.rstrip("\n")
        if not line.startswith("|"):
            inside = False
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if [c.lower() for c in cells] == header:
            inside = True
            continue
        if inside and not all(re.fullmatch(r":?-+:?", c) for c in cells):
            rows.append(cells)
    return rows


def first_code(cell):
    m = re.match(r"`([^`]+)`", cell)
    return m.group(1) if m else None


def run(args, **kw):
    return subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120,
                          **kw).stdout.decode("utf-8", "replace")


def clean_env():
    return {k: v for k, v in os.environ.items() if not k.startswith("STITCH_")}


def check_settings(repo, bin_dir):
    page = os.path.join(repo, "docs/reference/settings.md")
    printed, section = {}, ""
    for line in run([os.path.join(bin_dir, "stitch-node"), "--print-config"],
                    env=clean_env()).splitlines():
        if m := re.fullmatch(r"\[([a-z_.]+)\]", line.strip()):
            section = m.group(1)
        elif m := re.fullmatch(r"([a-z_]+) = (.*)", line.strip()):
            printed[(section + "." if section else "") + m.group(1)] = m.group(2)
    if len(printed) < 20:
        problem(f"stitch-node --print-config printed only {len(printed)} keys")
    documented = {}
    for cells in tables(page, ["key", "default", "meaning"]):
        key = first_code(cells[0])
        if key is None:
            problem(f"settings.md: a row without a key in backticks: {cells[0]}")
            continue
        if key in documented:
            problem(f"settings.md: {key} is documented twice")
        documented[key] = cells[1]
    for key in sorted(set(printed) - set(documented)):
        problem(f"settings.md: {key} (printed by --print-config) is not documented")
    for key in sorted(set(documented) - set(printed)):
        problem(f"settings.md: {key} is documented but --print-config does not print it")
    for key in sorted(set(printed) & set(documented)):
        shown, value = documented[key], printed[key]
        if key == "admin.token":
            continue
        code = re.findall(r"`([^`]*)`", shown)
        if not any(c == value or c == value.strip('"') for c in code):
            problem(f"settings.md: {key}'s default is {value} (--print-config), the page says {shown}")


def check_cli(repo, bin_dir):
    path = os.path.join(repo, "docs/reference/cli.md")
    if not os.path.exists(path):
        problem("docs/reference/cli.md is missing")
        return
    page = open(path, encoding="utf-8").read()
    text = run([os.path.join(bin_dir, "stitch"), "--help"], env=clean_env())
    commands, inside = set(), False
    for line in text.splitlines():
        if re.match(r"^subcommands:", line, re.I):
            inside = True
            continue
        if inside:
            m = re.match(r"^\s+([a-z][a-z-]*)\s", line + " ")
            if m:
                commands.add(m.group(1))
            elif line.strip() and not line.startswith(" "):
                inside = False
    if len(commands) < 5:
        problem(f"stitch --help listed only {sorted(commands)}")
    documented = set(re.findall(r"^## stitch ([a-z][a-z-]*)\s*$", page, re.M))
    for c in sorted(commands - documented):
        problem(f"cli.md: `stitch {c}` (in stitch --help) has no `## stitch {c}` section")
    for c in sorted(documented - commands):
        problem(f"cli.md: `## stitch {c}` documents a command stitch --help does not list")
    exit_codes = page.split("## Exit codes", 1)
    if len(exit_codes) != 2:
        problem("cli.md: no `## Exit codes` section")
    else:
        rows = re.findall(r"^\|\s*`?(\d+)`?\s*\|", exit_codes[1].split("\n## ", 1)[0], re.M)
        for code in ("0", "1", "2"):
            if code not in rows:
                problem(f"cli.md: exit code {code} is not in the exit codes table")


def source_files(repo):
    for d in SOURCE_DIRS:
        for root, _, files in os.walk(os.path.join(repo, d)):
            for f in files:
                if f.endswith(SOURCE_EXT):
                    yield os.path.join(root, f)


def source_text(repo):
    return "\n".join(open(p, encoding="utf-8", errors="replace").read() for p in source_files(repo))


def documented_metrics(repo):
    page = os.path.join(repo, "docs/reference/metrics.md")
    out = set()
    for cells in tables(page, ["metric", "type", "labels", "meaning"]):
        name = first_code(cells[0])
        if name is None:
            problem(f"metrics.md: a row without a metric name in backticks: {cells[0]}")
        elif name in out:
            problem(f"metrics.md: {name} is documented twice")
        else:
            out.add(name)
    return out


def check_metrics(repo, documented, source):
    emitted = set(METRIC.findall(source))
    for name in sorted(emitted - documented):
        problem(f"metrics.md: {name} (emitted in the source) is not documented")
    for name in sorted(documented - emitted):
        problem(f"metrics.md: {name} is documented but nothing in the source emits it")


def check_http(repo, source):
    page = os.path.join(repo, "docs/reference/http.md")
    routes = set()
    for cells in tables(page, ["route", "what it does"]):
        route = first_code(cells[0])
        m = re.fullmatch(r"(GET|POST|PUT|DELETE|PATCH|HEAD) (/\S*)", route or "")
        if not m:
            problem(f"http.md: a route cell is not `METHOD /path`: {cells[0]}")
            continue
        routes.add(route)
        for piece in re.split(r"<[^>]+>", m.group(2)):
            if len(piece) > 1 and piece not in source:
                problem(f"http.md: {route}: {piece!r} appears nowhere in the source")
    for route in CONTRACT_ROUTES:
        if route not in routes:
            problem(f"http.md: {route} (DESIGN §5) is not documented")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url):
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8", "replace")
    except Exception:
        return None, ""


def check_live_metrics(bin_dir, documented):
    """A node that published a version and served a request: every metric its
    status surface and its replica show is documented."""
    work = tempfile.mkdtemp(prefix="stitch-reference-")
    gw, st, co, rp = free_port(), free_port(), free_port(), free_port()
    env = clean_env()
    ckpt = os.path.join(work, "ckpt")
    run([os.path.join(bin_dir, "stitch"), "init-model", "--preset", "tiny", "--seed", "1",
         "--out", ckpt], env=env)
    node = subprocess.Popen(
        [os.path.join(bin_dir, "stitch-node"), "--data-dir", os.path.join(work, "data"),
         "--set", "replicas=1", "--set", f"gateway.listen=127.0.0.1:{gw}",
         "--set", f"status.listen=127.0.0.1:{st}", "--set", f"coordinator.listen=127.0.0.1:{co}",
         "--set", f"replica.listen=127.0.0.1:{rp}"],
        env=env, stdout=open(os.path.join(work, "node.log"), "w"), stderr=subprocess.STDOUT,
        start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        published = False
        while time.monotonic() < deadline:
            if node.poll() is not None:
                problem("the live node exited:\n" + open(os.path.join(work, "node.log")).read())
                return
            if not published:
                out = subprocess.run(
                    [os.path.join(bin_dir, "stitch"), "--coordinator", f"127.0.0.1:{co}",
                     "publish", "--run", "ref", "--version", "0", ckpt],
                    env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
                published = out.returncode == 0
            elif get(f"http://127.0.0.1:{gw}/health")[0] == 200:
                break
            time.sleep(0.3)
        else:
            problem("the live node never served version 0")
            return
        body = b'{"text":"hi","sampling_params":{"max_new_tokens":4}}'
        req = urllib.request.Request(f"http://127.0.0.1:{gw}/generate", data=body,
                                     headers={"Content-Type": "application/json"})
        urllib.request.urlopen(req, timeout=30).read()
        shown = set()
        for url in (f"http://127.0.0.1:{st}/metrics",):
            status, text = get(url)
            if status != 200:
                problem(f"{url} answered {status}")
                continue
            for line in text.splitlines():
                # Samples and the families their TYPE lines name.
                m = re.match(r"^(?:# TYPE )?([a-zA-Z_:][a-zA-Z0-9_:]*)", line)
                if m and (not line.startswith("#") or line.startswith("# TYPE ")):
                    shown.add(m.group(1))
        if not any(n.startswith("stitch_") for n in shown):
            problem("the live node's /metrics showed no stitch_ metric")
        for name in sorted(shown):
            base = re.sub(r"_(bucket|sum|count)$", "", name)
            if name not in documented and base not in documented:
                problem(f"metrics.md: {name} (shown by a live node's /metrics) is not documented")
    finally:
        os.killpg(node.pid, signal.SIGTERM)
        try:
            node.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(node.pid, signal.SIGKILL)
            node.wait()
        shutil.rmtree(work, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repo", required=True)
    ap.add_argument("--bin", required=True)
    ap.add_argument("--no-live", action="store_true", help="skip the live node")
    args = ap.parse_args()
    repo, bin_dir = os.path.abspath(args.repo), os.path.abspath(args.bin)
    source = source_text(repo)
    check_settings(repo, bin_dir)
    check_cli(repo, bin_dir)
    metrics = documented_metrics(repo)
    check_metrics(repo, metrics, source)
    check_http(repo, source)
    if not args.no_live:
        check_live_metrics(bin_dir, metrics)
    if problems:
        print("\n".join(problems), file=sys.stderr)
        print(f"{len(problems)} problem(s) in docs/reference/", file=sys.stderr)
        return 1
    print("docs/reference/ matches the binaries and the source")
    return 0


if __name__ == "__main__":
    sys.exit(main())
