#!/usr/bin/env python3
"""The chaos suite: a Stitch cluster under many faults at once while it serves.

A cluster of stitch-node processes, each in its own network namespace
(examples/netns/netns.sh: veth pairs to a bridge, its own address), runs an
experiment (the built-in trainer publishing a version per step, a rollout
driver, three replicas over three replica nodes with two slots each, a
gateway). Rollout clients keep sampling through the gateway with random
min/exact constraints and session ids; a side publisher keeps publishing a
second pool with `stitch publish`. A fault schedule drawn from the seed kills
(the hub, coordinator+store, included: it restarts from its data directory),
stops, partitions and corrupts while it runs; an invariant checker reads every
answer, the pointers, the replicas and, at the end, the store.

Invariants (each breach is a violation; the exit status is non-zero on any):
- every 200 answer's stamps satisfy its request's constraint (start <= end,
  min_version <= start, exact pins start == end == exact), name the run, and
  carry spans that agree with the stamps; no answer has another status than
  200, 409 (retryable) or 503 (retryable) — a refused connection while the
  gateway is down is counted, not a violation, and so is a 200 stream its
  replica's death cut short, which ends with a retryable error event;
- a pointer never moves back, and no answer stamps a version beyond the
  pointer;
- every replica serving a version gives the same greedy answer (tokens and
  logprobs) for a fixed probe as every other replica serving it — a replica
  that activated bytes whose checksum fails (a corrupted stored chunk) would
  not;
- no acknowledged version is lost: the side pool's acknowledged versions
  within the store's retention are exported at the end and must be byte for
  byte the directories they were published from; each pool's final pointer
  exports; a side publish is never refused for "too many publishes in
  progress" (the side publisher runs one at a time, so only sessions that
  killed publishers left open could fill the node's slots);
- after every fault heals, and after the faults stop, every replica converges
  to the pointer (all replicas ready, each at or past the pointer seen when
  the fault healed): the times are reported (p50, max), and the final
  convergence must happen within a bound.

The same seed draws the same schedule. The last line printed is a JSON object.
Usage: tests/chaos/run.sh [--seed S] [--minutes M] (see --help).
"""

import argparse
import bisect
import collections
import hashlib
import http.client
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NETNS = os.path.join(ROOT, "examples", "netns", "netns.sh")
RUN_ID = "chaos"
SIDE_POOL = "side"
REPLICAS = 3
REPLICA_NODES = ["r1", "r2", "r3"]
# Faults: kind -> (weight, targets, (shortest, longest) seconds it lasts).
FAULTS = {
    "kill_replica_node": (3, REPLICA_NODES, (1.0, 6.0)),
    "stop_replica_node": (2, REPLICA_NODES, (1.0, 5.0)),
    "partition": (3, REPLICA_NODES + ["front", "driver", "trainer"], (1.0, 6.0)),
    "kill_gateway": (1, ["front"], (0.5, 4.0)),
    "kill_driver": (1, ["driver"], (0.5, 4.0)),
    "kill_trainer": (1, ["trainer"], (0.5, 4.0)),
    "kill_publisher": (2, ["side-publisher"], (0.02, 0.4)),
    "corrupt_chunk": (1, ["store-chunk"], (8.0, 20.0)),
    "pause_hub": (1, ["hub"], (0.3, 1.5)),
    # The coordinator+store node: SIGKILLed and started again on its address
    # and data directory; replicas keep serving, nodes reconnect, the
    # coordinator recovers the experiment and adopts what kept running.
    "kill_hub": (1, ["hub"], (0.5, 3.0)),
}
# A node's restart and catch-up are part of its fault's window: no second
# fault on the same target until this long after the first ends.
SETTLE_S = 4.0
MAX_CONCURRENT = 2
PROBE_PROMPT = "the chaos probe"


def log(msg):
    print(f"[chaos {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ----------------------------------------------------------------------------
# The schedule


def draw_schedule(seed, window_s, mean_gap_s):
    """Faults as (start_s, kind, target, lasts_s, extra), from the seed alone."""
    rng = random.Random(seed)
    kinds = sorted(FAULTS)
    weights = [FAULTS[k][0] for k in kinds]
    busy_until = {}  # target -> time its last fault settles
    ends = []  # ends (with settle) of drawn faults, for the concurrency bound
    out = []
    t = 5.0
    while True:
        t += rng.expovariate(1.0 / mean_gap_s)
        if t >= window_s:
            break
        kind = rng.choices(kinds, weights)[0]
        _, targets, (lo, hi) = FAULTS[kind]
        # A target has one fault at a time (a node killed and one
        # partitioned are the same target).
        free = [x for x in targets if busy_until.get(x, 0.0) <= t]
        if not free or sum(1 for e in ends if e > t) >= MAX_CONCURRENT:
            continue
        target = rng.choice(free)
        lasts = round(rng.uniform(lo, hi), 2)
        if t + lasts >= window_s:
            continue
        extra = rng.randrange(1 << 30)
        out.append((round(t, 2), kind, target, lasts, extra))
        busy_until[target] = t + lasts + SETTLE_S
        ends.append(t + lasts + SETTLE_S)
    return out


# ----------------------------------------------------------------------------
# Processes and namespaces


def run(cmd, timeout=60, check=False):
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}): {r.stdout}{r.stderr}")
    return r


class Net:
    """Where nodes live: their own namespaces when the machine can make them,
    else loopback (no partitions then: they become SIGSTOPs, reported so)."""

    def __init__(self, tag, nodes):
        self.tag = tag
        self.index = {name: i + 1 for i, name in enumerate(nodes)}
        self.netns = False
        self.why_not = ""
        if os.geteuid() != 0:
            self.why_not = "network namespaces need root"
            return
        probe = run(["ip", "netns", "add", f"{tag}-p"])
        if probe.returncode != 0:
            self.why_not = "network namespaces cannot be made here: " + probe.stderr.strip()
            return
        run(["ip", "netns", "del", f"{tag}-p"])
        run([NETNS, "up", tag, str(len(nodes))], check=True)
        self.netns = True

    def addr(self, name):
        return f"10.231.0.{10 + self.index[name]}" if self.netns else "127.0.0.1"

    def wrapper(self, name):
        if not self.netns:
            return []
        return ["ip", "netns", "exec", f"{self.tag}-{self.index[name]}", "env",
                "UCX_TLS=tcp,self", "UCX_NET_DEVICES=st0"]

    def link(self, name, up):
        if self.netns:
            run([NETNS, "link", self.tag, str(self.index[name]), "up" if up else "down"])

    def down(self):
        if self.netns:
            run([NETNS, "down", self.tag], timeout=120)


class Node:
    def __init__(self, name, bindir, home, net, sets, ready):
        self.name, self.bindir, self.home, self.net = name, bindir, home, net
        self.sets, self.ready = sets, ready
        self.proc = None
        self.lock = threading.Lock()
        self.log_path = os.path.join(home, "node.log")
        os.makedirs(home, exist_ok=True)

    def start(self, timeout=40):
        with open(self.log_path, "a") as f:
            f.write(f"\n==== chaos: start at {time.time():.3f}\n")
            mark = f.tell()
        args = self.net.wrapper(self.name) + [
            os.path.join(self.bindir, "stitch-node"), "--data-dir",
            os.path.join(self.home, "data"), "--set", f"name={self.name}"]
        for s in self.sets:
            args += ["--set", s]
        logf = open(self.log_path, "a")
        with self.lock:
            self.proc = subprocess.Popen(args, stdout=logf, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL)
        logf.close()
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                return False
            with open(self.log_path, "rb") as f:
                f.seek(mark)
                if self.ready.encode() in f.read():
                    return True
            time.sleep(0.1)
        return False

    def signal(self, sig):
        with self.lock:
            if self.proc and self.proc.poll() is None:
                try:
                    self.proc.send_signal(sig)
                except ProcessLookupError:
                    pass

    def kill(self):
        self.signal(signal.SIGKILL)
        if self.proc:
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass

    def stop(self):
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM)
        if self.proc:
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def log_text(self):
        with open(self.log_path, "rb") as f:
            return f.read().decode("utf-8", "replace")


# ----------------------------------------------------------------------------
# HTTP


def http_call(host, port, method, path, body=None, headers=None, timeout=10.0, conn=None):
    """(status, headers dict, body text), or None when nothing answered."""
    try:
        c = conn or http.client.HTTPConnection(host, port, timeout=timeout)
        data = json.dumps(body).encode() if body is not None else None
        h = {"Content-Type": "application/json"} if data is not None else {}
        h.update(headers or {})
        c.request(method, path, body=data, headers=h)
        r = c.getresponse()
        text = r.read().decode("utf-8", "replace")
        return r.status, {k.lower(): v for k, v in r.getheaders()}, text
    except (OSError, http.client.HTTPException):
        if conn is not None:
            conn.close()
        return None


def get_json(host, port, path, timeout=3.0):
    r = http_call(host, port, "GET", path, timeout=timeout)
    if not r or r[0] != 200:
        return None
    try:
        return json.loads(r[2])
    except ValueError:
        return None


# ----------------------------------------------------------------------------
# The run


class Chaos:
    def __init__(self, args):
        self.args = args
        self.seed = args.seed
        self.bindir = args.bin
        self.work = tempfile.mkdtemp(prefix="stitch-chaos-")
        self.tag = f"chs{os.getpid() % 100000}"
        self.stop_flag = threading.Event()
        self.faults_on = threading.Event()
        self.lock = threading.Lock()
        self.violations = []
        self.answers = collections.Counter()
        self.requests = 0
        self.no_answer = 0
        # 200 streams cut by their replica's death, ended by a retryable error.
        self.interrupted_streams = 0
        self.served = collections.Counter()  # version -> 200 answers
        self.newest_seen = 0
        self.pointers = {}  # pool -> (run, version) newest seen
        self.pointer_polls = 0
        self.fingerprints = {}  # version -> (tokens, logprobs, replica)
        self.probes = 0
        self.faults_done = collections.Counter()
        self.fault_ended = {}  # target -> when its last fault ended (restart included)
        self.fault_notes = collections.Counter()
        self.recoveries = []  # (seconds from a fault's heal to convergence, fault kind)
        self.pending = []  # (healed_at, pointer version then, kind)
        self.side_acked = []  # (version, source dir)
        self.side_killed = 0
        self.side_current = None  # running publish process
        self.side_kill_next = threading.Event()
        self.corrupted = 0
        self.restart_failures = []
        self.checksum_failures = {}

    # -- violations --------------------------------------------------------
    def violate(self, what):
        with self.lock:
            self.violations.append(what)
        log("VIOLATION: " + what)

    # -- cluster -----------------------------------------------------------
    def cli(self, *args, timeout=20):
        cmd = [os.path.join(self.bindir, "stitch"), "--coordinator",
               f"{self.net.addr('hub')}:4300"] + list(args)
        try:
            return run(cmd, timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def setup(self):
        names = ["hub", "front"] + REPLICA_NODES + ["driver", "trainer"]
        self.net = Net(self.tag, names)
        hub = f"{self.net.addr('hub')}:4300"
        common = ["coordinator.heartbeat_timeout=2"]
        joined = "joined the coordinator; heartbeat"

        def node(name, sets, ready=joined):
            # Plain CAF between the namespaces' addresses, said so: the
            # namespaces' bridge reaches nothing else. Every node but the hub
            # listens for its mesh on its own address.
            extra = ["cluster.insecure=true"]
            if name != "hub":
                extra += [f"coordinator.address={hub}", f"cluster.listen={self.net.addr(name)}:0"]
            return Node(name, self.bindir, os.path.join(self.work, name), self.net,
                        common + extra + sets, ready)

        a = self.net.addr
        self.nodes = {
            "hub": node("hub", ["roles=coordinator,store,publisher", "replicas=0",
                                f"coordinator.listen={hub}"], "coordinator listening on"),
            "front": node("front", ["roles=gateway,status", f"gateway.listen={a('front')}:8180",
                                    f"status.listen={a('front')}:8181"]),
            "driver": node("driver", ["roles=rollout_driver"]),
            "trainer": node("trainer", ["roles=trainer"]),
        }
        for i, r in enumerate(REPLICA_NODES):
            # Loopback: every replica node on its own port range.
            port = 8200 if self.net.netns else 18200 + 10 * i
            self.nodes[r] = node(r, ["roles=replica", "gpus=0,1", "replicas=0",
                                     "replica.backstop=1", f"replica.listen={a(r)}:{port}"])
        for name in ["hub", "front"] + REPLICA_NODES + ["driver", "trainer"]:
            if not self.nodes[name].start():
                raise RuntimeError(f"node {name} did not start:\n" + self.nodes[name].log_text())
        log(f"nodes up ({'network namespaces' if self.net.netns else 'loopback: ' + self.net.why_not})")
        boot = os.path.join(self.work, "boot")
        run([os.path.join(self.bindir, "stitch"), "init-model", "--preset", "tiny", "--seed", "7",
             "--out", boot], check=True)
        # The side publisher's two checkpoints, alternated.
        self.side_dirs = []
        for s in (11, 12):
            d = os.path.join(self.work, f"side-{s}")
            run([os.path.join(self.bindir, "stitch"), "init-model", "--preset", "small", "--seed",
                 str(s), "--out", d], check=True)
            self.side_dirs.append(d)
        exp = os.path.join(self.work, "experiment.toml")
        with open(exp, "w") as f:
            f.write(f'run_id = "{RUN_ID}"\npool = "default"\nreplicas = {REPLICAS}\n'
                    'commit_mode = "in_place"\n\n[boot]\n'
                    f'dir = "{boot}"\nversion = 0\n\n[trainer]\nsteps = 1000000\n'
                    'samples_per_step = 4\nstaleness = 2\nlearning_rate = 0.5\n')
        r = self.cli("submit", exp, timeout=120)
        if r is None or r.returncode != 0:
            raise RuntimeError("submit failed: " + (r.stdout + r.stderr if r else "timed out"))
        if not self.wait_converged(0, 120):
            raise RuntimeError("the experiment's replicas never became ready:\n"
                               + self.nodes["hub"].log_text()[-4000:])
        log("experiment running; replicas ready")

    def teardown(self):
        for n in getattr(self, "nodes", {}).values():
            n.stop()
        if hasattr(self, "net"):
            self.net.down()

    # -- observation -------------------------------------------------------
    def pool_view(self):
        return get_json(self.net.addr("front"), 8180, "/pool", timeout=3.0)

    def ready_versions(self):
        """Ready replicas' applied versions (gateway's view), or None."""
        p = self.pool_view()
        if p is None:
            return None
        out = {}
        for r in p.get("replicas", []):
            if r.get("ready") and r.get("run_id") == RUN_ID:
                out[r.get("replica_id")] = r.get("applied_version")
            for k in ("checksum_failures_total",):
                n = r.get("metrics", {}).get(k, 0)
                if n:
                    with self.lock:
                        self.checksum_failures[r.get("replica_id")] = n
        return out

    def converged_at(self, version):
        v = self.ready_versions()
        return v is not None and len(v) >= REPLICAS and all(
            isinstance(x, int) and x >= version for x in v.values())

    def wait_converged(self, version, limit):
        deadline = time.time() + limit
        while time.time() < deadline and not self.stop_flag.is_set():
            if self.converged_at(version):
                return True
            time.sleep(0.25)
        return False

    def poll_pointers(self):
        while not self.stop_flag.is_set():
            r = self.cli("status", "--json", timeout=8)
            if r is not None and r.returncode == 0:
                try:
                    pools = json.loads(r.stdout).get("pools", [])
                except ValueError:
                    pools = []
                for p in pools:
                    if p.get("version") is None:
                        continue
                    now = (p.get("run_id"), int(p["version"]))
                    with self.lock:
                        before = self.pointers.get(p["pool"])
                        self.pointer_polls += 1
                        back = before and before[0] == now[0] and now[1] < before[1]
                        if not back:
                            self.pointers[p["pool"]] = now
                    if back:
                        self.violate(f"pool {p['pool']} pointer moved back from "
                                     f"{before[1]} to {now[1]}")
            self.check_recoveries()
            time.sleep(0.5)

    def pointer(self, pool="default"):
        with self.lock:
            p = self.pointers.get(pool)
        return p[1] if p else 0

    def check_recoveries(self):
        with self.lock:
            pending = list(self.pending)
        if not pending:
            return
        v = self.ready_versions()
        if v is None or len(v) < REPLICAS:
            return
        now = time.time()
        done = []
        for item in pending:
            healed, version, _ = item
            if all(isinstance(x, int) and x >= version for x in v.values()):
                done.append(item)
        with self.lock:
            for item in done:
                self.pending.remove(item)
                self.recoveries.append((now - item[0], item[2]))

    # -- load ----------------------------------------------------------------
    def client(self, i):
        rng = random.Random(self.seed * 1000 + i)
        host, port = self.net.addr("front"), 8180
        conn = None
        while not self.stop_flag.is_set():
            if conn is None:
                conn = http.client.HTTPConnection(host, port, timeout=30)
            with self.lock:
                newest = self.newest_seen
            body = {"text": f"chaos client {i} says {rng.randrange(1000)}",
                    "sampling_params": {"max_new_tokens": rng.choice([2, 4, 8]),
                                        "temperature": rng.choice([0.0, 0.7])}}
            pick = rng.random()
            want_min = want_exact = None
            if pick < 0.3:
                want_min = max(0, newest - rng.randrange(4))
            elif pick < 0.5:
                want_exact = max(0, newest - rng.randrange(3))
            elif pick < 0.55:
                # Ahead of anything published: a retryable 409.
                want_min = newest + 1000
            if want_min is not None or want_exact is not None:
                body["weight_version"] = {"min_version": want_min, "exact_version": want_exact}
            stream = rng.random() < 0.15
            if stream:
                body["stream"] = True
            headers = {}
            if rng.random() < 0.5:
                headers["X-Session-Id"] = f"session-{rng.randrange(40)}"
            r = http_call(host, port, "POST", "/generate", body, headers, conn=conn)
            with self.lock:
                self.requests += 1
            if r is None:
                conn = None
                with self.lock:
                    self.no_answer += 1
                time.sleep(0.2)
                continue
            status, hdrs, text = r
            with self.lock:
                self.answers[status] += 1
            if status == 200:
                self.check_answer(text, stream, want_min, want_exact)
            elif status in (409, 503):
                self.check_refusal(status, text, want_exact)
                time.sleep(0.05)
            else:
                self.violate(f"unexpected status {status}: {text[:300]}")
                time.sleep(0.05)

    def check_refusal(self, status, text, want_exact):
        """A 409 or 503 is retryable — except a 409 for an exact pin the pool
        has moved past (it will never be served again)."""
        try:
            doc = json.loads(text)
        except ValueError:
            self.violate(f"{status} answer is not JSON: {text[:200]}")
            return
        if doc.get("retryable") is True:
            return
        passed = (status == 409 and want_exact is not None
                  and isinstance(doc.get("applied"), int) and doc["applied"] > want_exact)
        if not passed:
            self.violate(f"{status} answer not marked retryable: {text[:200]}")

    def check_answer(self, text, stream, want_min, want_exact):
        if stream:
            # SSE lines end at "\n" only: str.splitlines() would also split at
            # U+0085, U+2028 and U+2029, which a generated text may hold
            # unescaped in its JSON (a false "unparsable answer" once).
            events = [ln[5:].strip() for ln in text.split("\n") if ln.startswith("data:")]
            events = [e for e in events if e and e != "[DONE]"]
            if not events:
                self.violate("a 200 stream without events")
                return
            text = events[-1]
            # A stream whose replica died after its first tokens ends with a
            # retryable error event (its status was sent with the first
            # event; a retry elsewhere would repeat tokens): counted, not a
            # violation. Any other error at the end is one.
            try:
                last = json.loads(text)
            except ValueError:
                last = None
            if isinstance(last, dict) and "meta_info" not in last and "error" in last:
                if last.get("retryable") is True:
                    with self.lock:
                        self.interrupted_streams += 1
                    return
                self.violate(f"a 200 stream ended with an error not marked retryable: {text[:200]}")
                return
        try:
            doc = json.loads(text)
            meta = doc["meta_info"]
            start, end = meta["weight_version_start"], meta["weight_version_end"]
            run_id = meta.get("run_id")
            spans = meta.get("weight_version_spans")
        except (ValueError, KeyError, TypeError):
            self.violate(f"unparsable 200 answer: {text[:200]}")
            return
        what = f"asked min {want_min} exact {want_exact}, got start {start} end {end}"
        if not isinstance(start, int) or not isinstance(end, int) or end < start:
            self.violate("bad stamps: " + what)
            return
        if want_min is not None and start < want_min:
            self.violate("min_version not honoured: " + what)
        if want_exact is not None and (start != want_exact or end != want_exact):
            self.violate("exact_version not honoured: " + what)
        if run_id != RUN_ID:
            self.violate(f"answer from run {run_id!r}, not {RUN_ID!r}")
        if spans and not spans_agree(spans, start, end):
            self.violate(f"spans {spans} disagree with stamps {start}..{end}")
        with self.lock:
            self.served[end] += 1
            self.newest_seen = max(self.newest_seen, end)

    # -- consistency probe -------------------------------------------------
    def replica_urls(self):
        """replica id -> (host, port) of the replicas now placed, from the
        logs of the nodes hosting them."""
        out = {}
        for name in REPLICA_NODES:
            for m in re.finditer(r"(\S+) serves http://([0-9.]+):([0-9]+)",
                                 self.nodes[name].log_text()):
                out[m.group(1)] = (m.group(2), int(m.group(3)))
        return out

    def probe(self):
        while not self.stop_flag.is_set():
            for rid, (host, port) in self.replica_urls().items():
                if self.stop_flag.is_set():
                    break
                info = get_json(host, port, "/server_info", timeout=2.0)
                if not info or not info.get("ready") or info.get("run_id") != RUN_ID:
                    continue
                v = info.get("applied_version")
                body = {"text": PROBE_PROMPT, "return_logprob": True,
                        "sampling_params": {"max_new_tokens": 4, "temperature": 0},
                        "weight_version": {"exact_version": v}}
                r = http_call(host, port, "POST", "/generate", body, timeout=5.0)
                if not r or r[0] != 200:
                    continue
                try:
                    doc = json.loads(r[2])
                    meta = doc["meta_info"]
                    if meta["weight_version_start"] != v or meta["weight_version_end"] != v:
                        continue
                    tokens = doc["output_ids"]
                    lps = [x[0] for x in meta["output_token_logprobs"]]
                except (ValueError, KeyError, TypeError, IndexError):
                    self.violate(f"{rid}: unparsable probe answer {r[2][:200]}")
                    continue
                with self.lock:
                    self.probes += 1
                    seen = self.fingerprints.get(v)
                    if seen is None:
                        self.fingerprints[v] = (tokens, lps, rid)
                        continue
                if seen[0] != tokens or any(abs(a - b) > 1e-3 for a, b in zip(seen[1], lps)):
                    self.violate(f"{rid} serves version {v} with other weights than {seen[2]}: "
                                 f"tokens {tokens} vs {seen[0]}, logprobs {lps} vs {seen[1]}")
            time.sleep(1.0)

    # -- side publisher ------------------------------------------------------
    def side_publisher(self):
        version = 0
        while not self.stop_flag.is_set():
            src = self.side_dirs[version % 2]
            cmd = [os.path.join(self.bindir, "stitch"), "--coordinator",
                   f"{self.net.addr('hub')}:4300", "publish", "--retry-budget", "0", "--pool",
                   SIDE_POOL, "--run", "side", "--version", str(version), src]
            p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            with self.lock:
                self.side_current = p
            killed = False
            if self.side_kill_next.is_set():
                self.side_kill_next.clear()
                time.sleep(self.side_kill_delay)
                if p.poll() is None:
                    p.kill()
                    killed = True
            try:
                out, _ = p.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                p.kill()
                out, _ = p.communicate()
            with self.lock:
                self.side_current = None
            if killed or p.returncode == -signal.SIGKILL:
                with self.lock:
                    self.side_killed += 1
                continue  # the same version again: redone or already there
            if p.returncode == 0:
                with self.lock:
                    self.side_acked.append((version, src))
                version += 1
                self.stop_flag.wait(1.5)
            else:
                # The hub paused or a link down: not a loss, try again.
                why = out.strip().splitlines()[-1][:80] if out.strip() else "no output"
                with self.lock:
                    self.fault_notes["side publish refused: " + why] += 1
                # One publisher, one publish at a time: only sessions that
                # killed publishers left behind can fill the node's slots
                # (asked once: `--retry-budget 0`, so a leak is not waited out).
                if "too many publishes in progress" in out:
                    self.violate("a side publish was refused for sessions that killed "
                                 "publishers left open: " + why)
                self.stop_flag.wait(1.0)

    # -- faults --------------------------------------------------------------
    def corrupt(self, lasts, extra):
        rng = random.Random(extra)
        base = os.path.join(self.work, "hub", "data", "store", "versions", "default", RUN_ID)
        try:
            dirs = sorted(os.listdir(base))
        except OSError:
            return "no version directories yet"
        # Versions whose step changed no weights hold no shards (a trainer
        # whose reward saturated publishes empty deltas): the newest six
        # that hold any.
        def shards_of(name):
            try:
                return sorted(f for f in os.listdir(os.path.join(base, name))
                              if f.endswith(".safetensors"))
            except OSError:
                return []
        dirs = [x for x in dirs if shards_of(x)]
        if not dirs:
            return "no version holds shards yet"
        d = os.path.join(base, rng.choice(dirs[-6:]))
        try:
            shards = shards_of(os.path.basename(d))
            path = os.path.join(d, rng.choice(shards))
            with open(path, "r+b") as f:
                head = int.from_bytes(f.read(8), "little")
                size = os.fstat(f.fileno()).st_size
                first = 8 + head
                if size - first < 64:
                    return "shard too small"
                n = min(4096, size - first)
                at = first + rng.randrange(size - first - n + 1)
                f.seek(at)
                original = f.read(n)
                f.seek(at)
                f.write(bytes(rng.randrange(256) for _ in range(n)))
                f.flush()
                os.fsync(f.fileno())
        except (OSError, IndexError, ValueError) as e:
            return f"could not corrupt: {e}"
        self.corrupted += 1
        self.stop_flag.wait(lasts)
        try:
            with open(path, "r+b") as f:
                f.seek(at)
                f.write(original)
                f.flush()
                os.fsync(f.fileno())
        except OSError:
            pass  # retention removed the version meanwhile
        return None

    def restart(self, name):
        if not self.nodes[name].start():
            self.restart_failures.append(name)
            self.violate(f"node {name} did not restart:\n" + self.nodes[name].log_text()[-2000:])

    def fault(self, kind, target, lasts, extra):
        node = self.nodes.get(target)
        note = None
        if kind.startswith("kill_") and kind != "kill_publisher":
            node.kill()
            self.stop_flag.wait(lasts)
            self.restart(target)
        elif kind == "stop_replica_node" or kind == "pause_hub" or (
                kind == "partition" and not self.net.netns):
            node.signal(signal.SIGSTOP)
            time.sleep(lasts)
            node.signal(signal.SIGCONT)
        elif kind == "partition":
            self.net.link(target, False)
            time.sleep(lasts)
            self.net.link(target, True)
        elif kind == "kill_publisher":
            self.side_kill_delay = lasts
            with self.lock:
                p = self.side_current
            if p is not None and p.poll() is None:
                time.sleep(lasts)
                if p.poll() is None:
                    p.kill()
            else:
                self.side_kill_next.set()
        elif kind == "corrupt_chunk":
            note = self.corrupt(lasts, extra)
        with self.lock:
            self.fault_ended[target] = time.time()
            self.faults_done[kind] += 1
            if note:
                self.fault_notes[f"{kind}: {note}"] += 1
            self.pending.append((time.time(), self.pointers.get("default", (None, 0))[1], kind))

    def run_schedule(self, schedule, t0):
        threads = []
        running = {}  # target -> the thread of its latest fault
        for start, kind, target, lasts, extra in schedule:
            wait = t0 + start - time.time()
            if wait > 0 and self.stop_flag.wait(wait):
                break
            # The schedule gives a target one fault at a time, settled before
            # the next; a run that fell behind it (the machine stalled, so
            # faults are due at once) keeps that: a node killed twice at once
            # would be started twice, and its second self refused by name.
            prev = running.get(target)
            if prev is not None and prev.is_alive():
                log(f"fault {kind} on {target} waits: its previous fault is still on")
                prev.join(timeout=120)
            with self.lock:
                settle = self.fault_ended.get(target, 0.0) + SETTLE_S - time.time()
            if settle > 0 and self.stop_flag.wait(settle):
                break
            log(f"fault {kind} on {target} for {lasts} s")
            t = threading.Thread(target=self.fault, args=(kind, target, lasts, extra), daemon=True)
            t.start()
            running[target] = t
            threads.append(t)
        for t in threads:
            t.join(timeout=120)

    # -- the end -------------------------------------------------------------
    def final_checks(self):
        lost = []
        # Each pool's final pointer exports; the side pool's acknowledged
        # versions within retention are byte for byte their sources.
        pools, why = {}, "no answer"
        for _ in range(5):
            r = self.cli("status", "--json", timeout=20)
            if r is not None and r.returncode == 0:
                try:
                    pools = {p["pool"]: p for p in json.loads(r.stdout).get("pools", [])}
                    break
                except (ValueError, KeyError, TypeError):
                    pass
            why = (r.stdout + r.stderr)[-500:] if r is not None else "timed out"
            time.sleep(2)
        final = pools.get("default")
        if not final:
            self.violate("pool default has no pointer at the end: " + why)
        else:
            seen = self.pointer("default")
            if final["version"] < seen:
                self.violate(f"final pointer {final['version']} behind {seen}, seen before")
            out = os.path.join(self.work, "export-default")
            e = self.cli("export", "--version", f"{RUN_ID}/{final['version']}", "--out", out,
                         timeout=120)
            if e is None or e.returncode != 0:
                lost.append(f"default {RUN_ID}/{final['version']}")
                self.violate("the final pointer's version does not export: "
                             + (e.stdout + e.stderr if e else "timed out"))
            with self.lock:
                beyond = [v for v in self.served if v > final["version"]]
            if beyond:
                self.violate(f"answers stamped versions {beyond[:5]} beyond the final pointer "
                             f"{final['version']}")
        with self.lock:
            acked = list(self.side_acked)
        side = pools.get(SIDE_POOL)
        if acked:
            newest = acked[-1][0]
            if not side or side["version"] < newest:
                self.violate(f"side pool points at {side and side['version']}, not at its newest "
                             f"acknowledged version {newest}")
            keep = self.retained(acked)
            for version, src in keep:
                out = os.path.join(self.work, f"export-side-{version}")
                e = self.cli("export", "--version", f"side/{version}", "--out", out, timeout=120)
                if e is None or e.returncode != 0 or not same_tensors(src, out):
                    lost.append(f"side side/{version}")
                    self.violate(f"acknowledged side/{version} lost or changed: "
                                 + (e.stdout + e.stderr if e else "timed out")[-300:])
                shutil.rmtree(out, ignore_errors=True)
        return lost

    def retained(self, acked):
        """The acknowledged versions the store must still hold: its
        retention keeps the newest `store.retain_versions` (default 20)."""
        return acked[-20:]

    def main(self):
        schedule = draw_schedule(self.seed, self.window_s, self.args.mean_gap)
        digest = hashlib.sha256(json.dumps(schedule).encode()).hexdigest()[:16]
        log(f"seed {self.seed}: {len(schedule)} faults over {self.window_s:.0f} s "
            f"(schedule {digest}), then {self.args.calm:.0f} s calm")
        if self.args.print_schedule:
            for f in schedule:
                print(json.dumps(f))
            return 0
        began = time.time()
        try:
            self.setup()
            workers = [threading.Thread(target=self.client, args=(i,), daemon=True)
                       for i in range(self.args.clients)]
            workers += [threading.Thread(target=f, daemon=True)
                        for f in (self.poll_pointers, self.probe, self.side_publisher)]
            for w in workers:
                w.start()
            t0 = time.time()
            self.run_schedule(schedule, t0)
            self.stop_flag.wait(max(0.0, t0 + self.window_s - time.time()))
            calm_from = time.time()
            calm_pointer = self.pointer("default")
            log(f"faults over; pointer at {calm_pointer}; converging")
            converged = self.wait_converged(calm_pointer, self.args.converge_limit)
            final_converge = time.time() - calm_from
            if not converged:
                self.violate(f"replicas did not converge to {calm_pointer} within "
                             f"{self.args.converge_limit:.0f} s after the faults stopped: "
                             f"{self.ready_versions()}")
            rest = calm_from + self.args.calm - time.time()
            if rest > 0:
                self.stop_flag.wait(rest)
            self.stop_flag.set()
            for w in workers:
                w.join(timeout=60)
            lost = self.final_checks()
        finally:
            self.stop_flag.set()
            self.teardown()
        with self.lock:
            pending = len(self.pending)
            heals = list(self.recoveries) + [(final_converge, "calm")]
        return self.report(schedule, time.time() - began, lost, heals, pending)

    def report(self, schedule, duration, lost, heals, pending):
        # heals: (seconds to converge, the fault kind it followed; "calm" for
        # the convergence after the last fault).
        times = sorted(t for t, _ in heals)
        slowest = max(heals, key=lambda h: h[0]) if heals else (0.0, "")
        max_by_kind = {}
        for t, kind in heals:
            max_by_kind[kind] = round(max(t, max_by_kind.get(kind, 0.0)), 2)
        answers = {str(k): v for k, v in sorted(self.answers.items())}
        answers["no_answer"] = self.no_answer
        answers["interrupted_streams"] = self.interrupted_streams
        p50 = statistics.median(times) if times else 0.0
        print()
        print(f"seed               {self.seed}")
        print(f"mode               {'network namespaces' if self.net.netns else 'loopback (' + self.net.why_not + ')'}")
        print(f"duration           {duration:.0f} s ({self.window_s:.0f} s of faults)")
        print(f"requests           {self.requests}")
        print(f"answers            {answers}")
        print(f"faults             {sum(self.faults_done.values())} {dict(sorted(self.faults_done.items()))}")
        for k, v in sorted(self.fault_notes.items()):
            print(f"  note             {v} x {k}")
        print(f"side publishes     {len(self.side_acked)} acknowledged, {self.side_killed} killed")
        print(f"chunks corrupted   {self.corrupted}; checksum failures seen by replicas "
              f"{sum(self.checksum_failures.values())}")
        print(f"probes             {self.probes} over {len(self.fingerprints)} versions")
        print(f"pointer            default at {self.pointer('default')}, {self.pointer_polls} polls")
        print(f"versions served    {len(self.served)}")
        print(f"converge (s)       p50 {p50:.2f}, max {slowest[0]:.2f} (after {slowest[1] or '-'}) "
              f"over {len(times)} heals; {pending} unhealed at the end")
        print(f"  slowest by fault {dict(sorted(max_by_kind.items()))}")
        print(f"violations         {len(self.violations)}")
        for v in self.violations[:20]:
            print(f"  - {v[:400]}")
        print(f"lost versions      {len(lost)} {lost[:10]}")
        result = {
            "seed": self.seed, "mode": "netns" if self.net.netns else "loopback",
            "duration_s": round(duration, 1), "requests": self.requests, "answers": answers,
            "faults": sum(self.faults_done.values()),
            "faults_by_kind": dict(sorted(self.faults_done.items())),
            "side_acknowledged": len(self.side_acked), "side_killed": self.side_killed,
            "chunks_corrupted": self.corrupted,
            "checksum_failures_seen": sum(self.checksum_failures.values()),
            "probes": self.probes, "final_pointer": self.pointer("default"),
            "violations": len(self.violations), "lost_versions": len(lost),
            "converge_p50_s": round(p50, 2),
            "converge_max_s": round(slowest[0], 2),
            "converge_max_after": slowest[1],
            "converge_max_by_kind": dict(sorted(max_by_kind.items())),
        }
        print(json.dumps(result))
        return 1 if self.violations or lost else 0


def spans_agree(spans, start, end):
    """Spans name versions within the stamps, in order, over consecutive
    tokens (a swap before the first token makes the first span later than
    the start stamp)."""
    try:
        versions = [x["version"] for x in spans]
        if any(not (start <= v <= end) for v in versions) or versions != sorted(versions):
            return False
        for a, b in zip(spans, spans[1:]):
            if b["first_token"] != a["last_token"] + 1:
                return False
        return spans[0]["first_token"] == 0
    except (KeyError, TypeError):
        return False


def same_tensors(src, out):
    """Whether every safetensors file of `src` is in `out`, byte for byte."""
    names = [f for f in os.listdir(src) if f.endswith(".safetensors")]
    if not names:
        return False
    for n in names:
        p = os.path.join(out, n)
        if not os.path.exists(p):
            return False
        with open(os.path.join(src, n), "rb") as a, open(p, "rb") as b:
            if a.read() != b.read():
                return False
    return True


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=None, help="draws the schedule (default: random)")
    ap.add_argument("--minutes", type=float, default=3.0,
                    help="how long faults are injected, calm tail included (default 3)")
    ap.add_argument("--calm", type=float, default=30.0,
                    help="seconds without faults at the end (default 30)")
    ap.add_argument("--mean-gap", type=float, default=3.0,
                    help="mean seconds between fault starts (default 3)")
    ap.add_argument("--clients", type=int, default=3, help="rollout clients (default 3)")
    ap.add_argument("--converge-limit", type=float, default=120.0,
                    help="seconds the replicas have to converge after the faults stop")
    ap.add_argument("--bin", default=os.environ.get("STITCH_BIN_DIR",
                                                    os.path.join(ROOT, "build", "bin")))
    ap.add_argument("--keep", action="store_true",
                    help="keep the nodes' logs and data after a passing run too")
    ap.add_argument("--print-schedule", action="store_true",
                    help="print the seed's schedule and exit")
    args = ap.parse_args()
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1 << 31)
    chaos = Chaos(args)
    chaos.window_s = max(10.0, args.minutes * 60 - args.calm)
    # A run stopped from outside (SIGTERM) still tears its cluster down:
    # namespaces, links and nodes left behind would break the next run.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        code = chaos.main()
    except Exception as e:  # the report says why the run could not happen
        chaos.stop_flag.set()
        chaos.teardown()
        print(f"chaos: {e}", file=sys.stderr)
        print(json.dumps({"seed": args.seed, "error": str(e)[:2000]}))
        code = 2
    if code == 0 and not args.keep:
        shutil.rmtree(chaos.work, ignore_errors=True)
    else:
        print(f"chaos: logs kept in {chaos.work}", file=sys.stderr)
    sys.exit(code)


if __name__ == "__main__":
    main()
