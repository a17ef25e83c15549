#!/usr/bin/env python3
"""Runs the runnable snippets of one documentation page, so the docs cannot rot.

Every fenced block whose language is a shell or Python must say what it is in
its info string:

    ```sh run                  run it; it must exit 0
    ```sh run expect=TEXT      ... and its output must contain TEXT
    ```sh run-background       start it (a node), wait until its surfaces answer
    ```python run              run it with python3 (clients/python importable)
    ```sh norun                shown, not run (GPU machines, clusters, long jobs)

and every `toml` block is a node role file the node must accept
(```` ```toml check ````: `stitch-node --config F --print-config` exits 0) or
says it is not one (```` ```toml norun ````: an experiment file, a fragment).

An unmarked shell or Python block fails the page: a new snippet is either run
or explicitly not. The blocks of a page run in order, as one reader would type
them, from a scratch directory. To run beside other tests, the default ports
(gateway 8080, status 8081, publisher 8082, coordinator 4242, replicas
8100 + i) become free ports, both in the text and through the node's and the
CLI's environment (STITCH_<SECTION>__<KEY>, STITCH_COORDINATOR); `/tmp/`
becomes the scratch directory; `build/bin/` is the build's binaries and the
repository's folders are named absolutely. Background processes are killed
when the page ends.

usage: run_snippets.py --repo DIR --bin DIR PAGE.md
"""

import argparse
import os
import re
import shutil
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

SHELLS = {"sh", "bash", "shell", "console"}
PYTHONS = {"python", "python3", "py"}
MARKS = {"run", "run-background", "norun"}
TOML_MARKS = {"check", "norun"}
BLOCK_TIMEOUT_S = 300
READY_TIMEOUT_S = 120
# The repository's folders a snippet may name relative to its root.
REPO_FOLDERS = ["clients", "examples", "scripts", "config", "bench", "docs", "tests"]


class Block:
    def __init__(self, page, line, lang, marks, text):
        self.page, self.line, self.lang, self.marks, self.text = page, line, lang, marks, text

    def where(self):
        return f"{self.page}:{self.line}"


def parse_blocks(page):
    """Every fenced block of the page: (line, language, info tokens, text)."""
    blocks, lines = [], open(page, encoding="utf-8").read().split("\n")
    i = 0
    while i < len(lines):
        m = re.match(r"^(\s*)(`{3,}|~{3,})(.*)$", lines[i])
        if not m:
            i += 1
            continue
        indent, fence, info = m.group(1), m.group(2), m.group(3).strip()
        start, body = i + 1, []
        i += 1
        while i < len(lines) and not re.match(r"^\s*" + re.escape(fence[0]) + "{%d,}\\s*$" % len(fence), lines[i]):
            line = lines[i]
            body.append(line[len(indent):] if line.startswith(indent) else line)
            i += 1
        if i >= len(lines):
            raise SystemExit(f"{page}:{start}: a fenced block is never closed")
        i += 1
        tokens = info.split()
        lang = tokens[0].lower() if tokens else ""
        blocks.append(Block(page, start, lang, tokens[1:], "\n".join(body) + "\n"))
    return blocks


def free_port(consecutive=1):
    """A port (the first of `consecutive` free ones) nobody listens on now."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + consecutive > 65535:
            continue
        ok = True
        for p in range(base + 1, base + consecutive):
            with socket.socket() as t:
                try:
                    t.bind(("127.0.0.1", p))
                except OSError:
                    ok = False
        if ok:
            return base
    raise SystemExit("no free ports")


class Page:
    def __init__(self, repo, bin_dir, page):
        self.repo, self.bin_dir, self.page = os.path.abspath(repo), os.path.abspath(bin_dir), page
        self.scratch = tempfile.mkdtemp(prefix="stitch-docs-")
        replicas = free_port(8)
        self.ports = {
            "8080": str(free_port()), "8081": str(free_port()), "8082": str(free_port()),
            "4242": str(free_port()),
        }
        for i in range(8):
            self.ports[str(8100 + i)] = str(replicas + i)
        self.background = []
        self.env = dict(os.environ)
        self.env.update({
            "STITCH_GATEWAY__LISTEN": "127.0.0.1:" + self.ports["8080"],
            "STITCH_STATUS__LISTEN": "127.0.0.1:" + self.ports["8081"],
            "STITCH_COORDINATOR__LISTEN": "127.0.0.1:" + self.ports["4242"],
            "STITCH_REPLICA__LISTEN": "127.0.0.1:" + self.ports["8100"],
            "STITCH_COORDINATOR": "127.0.0.1:" + self.ports["4242"],
            "PYTHONPATH": os.path.join(self.repo, "clients", "python"),
            # A Debian machine's PATH: the system python3 (with python3-torch),
            # not whatever interpreter a developer's shell puts first.
            "PATH": os.pathsep.join([self.bin_dir, "/usr/local/bin", "/usr/sbin", "/usr/bin",
                                     "/sbin", "/bin"]),
            "HOME": self.scratch,
        })
        self.env.pop("STITCH_TOKEN", None)

    def rewrite(self, text):
        for default, port in self.ports.items():
            text = re.sub(r"(?<=[:=\s])" + default + r"\b", port, text)
        text = text.replace("/tmp/", self.scratch + "/")
        text = re.sub(r"(?<![\w./-])build/bin/", self.bin_dir + "/", text)
        for folder in REPO_FOLDERS:
            text = re.sub(r"(?<![\w./-])" + folder + "/", os.path.join(self.repo, folder) + "/", text)
        return text

    def command(self, block, script):
        if block.lang in PYTHONS:
            return ["/usr/bin/python3", "-c", script]
        return ["bash", "-euo", "pipefail", "-c", script]

    def check_toml(self, block):
        path = os.path.join(self.scratch, f"block-{block.line}.toml")
        with open(path, "w", encoding="utf-8") as f:
            f.write(block.text)
        print(f"--- {block.where()} (toml check)", flush=True)
        env = {k: v for k, v in self.env.items() if not k.startswith("STITCH_")}
        done = subprocess.run([os.path.join(self.bin_dir, "stitch-node"), "--config", path,
                               "--print-config"], cwd=self.scratch, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
        if done.returncode != 0:
            self.fail(block, "is not a role file stitch-node accepts:\n"
                      + done.stdout.decode("utf-8", "replace"))

    def run(self, block):
        if block.lang == "toml":
            return self.check_toml(block)
        script = self.rewrite(block.text)
        expect = [m.split("=", 1)[1] for m in block.marks if m.startswith("expect=")]
        print(f"--- {block.where()} ({block.lang} {' '.join(block.marks)})\n{script}", flush=True)
        if "run-background" in block.marks:
            log = open(os.path.join(self.scratch, f"background-{block.line}.log"), "w")
            proc = subprocess.Popen(self.command(block, script), cwd=self.scratch, env=self.env,
                                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            self.background.append((proc, log.name))
            self.wait_ready(block, proc, log.name)
            return
        try:
            done = subprocess.run(self.command(block, script), cwd=self.scratch, env=self.env,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  timeout=BLOCK_TIMEOUT_S, start_new_session=True)
        except subprocess.TimeoutExpired:
            self.fail(block, f"did not finish within {BLOCK_TIMEOUT_S} s")
        out = done.stdout.decode("utf-8", "replace")
        print(out, flush=True)
        if done.returncode != 0:
            self.fail(block, f"exited {done.returncode}")
        for text in expect:
            if text not in out:
                self.fail(block, f"its output does not contain {text!r}")

    def wait_ready(self, block, proc, log):
        """A background node is ready when its status surface answers /status
        and its gateway answers at all (its /health is 503 until a replica
        serves a claimed run, which the page's next blocks publish)."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        status = f"http://127.0.0.1:{self.ports['8081']}/status"
        health = f"http://127.0.0.1:{self.ports['8080']}/health"
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                self.fail(block, f"exited {proc.returncode} while starting:\n" + open(log).read())
            if self.answers(status) == 200 and self.answers(health) is not None:
                return
            time.sleep(0.2)
        self.fail(block, f"not ready within {READY_TIMEOUT_S} s:\n" + open(log).read())

    @staticmethod
    def answers(url):
        """The HTTP status `url` answers, None when nothing answers."""
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                return r.status
        except urllib.error.HTTPError as e:
            return e.code
        except Exception:
            return None

    def fail(self, block, why):
        self.stop()
        raise SystemExit(f"FAIL {block.where()}: the snippet {why}")

    def clean(self):
        """The scratch directory goes with the page (checkpoints, a store)."""
        shutil.rmtree(self.scratch, ignore_errors=True)

    def stop(self):
        for proc, log in self.background:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
        self.background = []


def check_marks(blocks):
    problems = []
    for b in blocks:
        if b.lang == "toml":
            if len([m for m in b.marks if m in TOML_MARKS]) != 1 or len(b.marks) != 1:
                problems.append(f"{b.where()}: a toml block must be marked check or norun "
                                f"(has {' '.join(b.marks) or 'nothing'})")
            continue
        if b.lang not in SHELLS | PYTHONS:
            continue
        marks = [m for m in b.marks if m in MARKS]
        unknown = [m for m in b.marks if m not in MARKS and not m.startswith("expect=")]
        if len(marks) != 1:
            problems.append(f"{b.where()}: a {b.lang} block must be marked exactly one of "
                            f"run, run-background, norun (has {' '.join(b.marks) or 'nothing'})")
        if unknown:
            problems.append(f"{b.where()}: unknown marks {' '.join(unknown)}")
    return problems


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repo", required=True)
    ap.add_argument("--bin", required=True)
    ap.add_argument("--check-marks-only", action="store_true")
    ap.add_argument("page")
    args = ap.parse_args()
    blocks = parse_blocks(args.page)
    problems = check_marks(blocks)
    if problems:
        raise SystemExit("\n".join(problems))
    runnable = [b for b in blocks if set(b.marks) & {"run", "run-background"}
                or (b.lang == "toml" and "check" in b.marks)]
    print(f"{args.page}: {len(runnable)} runnable of {len(blocks)} blocks")
    if args.check_marks_only:
        return
    page = Page(args.repo, args.bin, args.page)
    try:
        for b in runnable:
            page.run(b)
    finally:
        page.stop()
        page.clean()
    print(f"{args.page}: every runnable snippet passed")


if __name__ == "__main__":
    main()
