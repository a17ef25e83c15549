"""The Python client against a real stitch-node: publish over HTTP (a
directory, a state dict, deltas), the publish rules (idempotent re-publish,
VersionExists, rewind, abort, malformed tensors, the admin token), and
constrained rollouts through the gateway (stamps, retried 409s).

Run: PYTHONPATH=clients/python STITCH_BIN_DIR=build/bin python3 -m unittest discover clients/python/tests
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.parse

from harness import BIN, Node, init_model
from stitch_client import Client, StitchError, TensorBytes


def read_safetensors(path: str):
    """Every tensor of the directory's safetensors files as TensorBytes."""
    out = {}
    for f in sorted(os.listdir(path)):
        if not f.endswith(".safetensors"):
            continue
        with open(os.path.join(path, f), "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
            data = fh.read()
        for name, spec in header.items():
            if name == "__metadata__":
                continue
            b, e = spec["data_offsets"]
            out[name] = TensorBytes(spec["dtype"], spec["shape"], bytearray(data[b:e]))
    return out


def listed(path: str):
    """The directory's tensors, their names sorted, and the listing a
    session opens with (name, dtype, shape)."""
    weights = read_safetensors(path)
    names = sorted(weights)
    return weights, names, [(n, weights[n].dtype, weights[n].shape) for n in names]


def booted(tmp: str):
    """`listed` of a fresh tiny model (seed 5) written under ``tmp``."""
    boot = os.path.join(tmp, "boot")
    init_model(boot, 5)
    return listed(boot)


class PublishAndRollouts(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="stitch-client-test-")
        cls.node = Node(os.path.join(cls.tmp, "node"))
        cls.client = Client(publisher=cls.node.publisher, gateway=cls.node.gateway)
        cls.boot = os.path.join(cls.tmp, "boot")
        init_model(cls.boot, 5)
        first = cls.client.publish(cls.boot, run="r", version=0)
        assert first["kind"] == "anchor" and first["claimed"], first
        cls.client.wait_until_serving(0, timeout=60)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.node.stop()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_a_generation_carries_its_stamps_and_an_unmet_constraint_is_a_409(self):
        answer = self.client.generate(
            "hello", sampling_params={"max_new_tokens": 4, "temperature": 0}, min_version=0
        )
        self.assertEqual(answer["meta_info"]["weight_version_start"], 0)
        self.assertEqual(answer["meta_info"]["weight_version_end"], 0)
        # Which version made which tokens (one version here: all of them).
        n = len(answer["output_ids"])
        self.assertEqual(answer["meta_info"]["weight_version_spans"],
                         [{"version": 0, "first_token": 0, "last_token": n - 1}])
        # And server_info says the engine reports them.
        self.assertTrue(all(r["weight_version_spans"] for r in self.client.status()["replicas"]))
        self.assertIn("stitch_replica", answer)
        chat = self.client.chat([{"role": "user", "content": "hi"}], exact_version=0, max_tokens=3)
        self.assertEqual(chat["weight_version_start"], 0)
        self.assertEqual(chat["weight_version_spans"][0]["version"], 0)
        started = time.monotonic()
        with self.assertRaises(StitchError) as caught:
            self.client.generate("hello", min_version=99, retry_budget=1.5)
        # Retried (Retry-After: 1) within the budget, then raised.
        self.assertGreaterEqual(time.monotonic() - started, 0.9)
        self.assertEqual(caught.exception.status, 409)
        self.assertEqual(caught.exception.type, "WeightVersionNotReady")
        self.assertTrue(caught.exception.retryable)
        self.assertEqual(caught.exception.body["target_version"], 99)

    def test_republishing_the_same_bytes_is_idempotent_and_other_bytes_are_refused(self):
        first = self.client.publish(self.boot, run="r", version=0, pool="idem")
        self.assertFalse(first["idempotent"])
        again = self.client.publish(self.boot, run="r", version=0, pool="idem")
        self.assertTrue(again["idempotent"])
        other = os.path.join(self.tmp, "other")
        init_model(other, 6)
        with self.assertRaises(StitchError) as caught:
            self.client.publish(other, run="r", version=0, pool="idem")
        self.assertEqual(caught.exception.status, 409)
        self.assertEqual(caught.exception.type, "VersionExists")

    def test_a_state_dict_publishes_as_a_delta_that_replicas_serve(self):
        weights = read_safetensors(self.boot)
        name = sorted(weights)[0]
        first = weights[name].data
        first[0:4] = bytes((b ^ 0x40) for b in first[0:4])
        done = self.client.publish(weights, run="r", version=1)
        self.assertEqual(done["kind"], "delta")
        self.assertEqual(done["touched"], [name])
        self.assertEqual(done["ref"], "r/weight_v000001")
        self.client.wait_until_serving(1, run="r", timeout=60)
        answer = self.client.generate("hello", sampling_params={"max_new_tokens": 2}, exact_version=1)
        self.assertEqual(answer["meta_info"]["weight_version_start"], 1)
        # Below the run's newest version: refused (a rewind).
        weights[name].data[8:12] = b"\x00\x01\x02\x03"
        self.client.publish(weights, run="r", version=3)
        with self.assertRaises(StitchError) as caught:
            self.client.publish(weights, run="r", version=2)
        self.assertEqual(caught.exception.status, 409, str(caught.exception))
        self.assertEqual(caught.exception.type, "Rewind")

    def test_an_aborted_session_leaves_nothing_and_its_version_stays_free(self):
        weights, names, listing = listed(self.boot)
        session = self.client.open_session(listing, run="aborted", version=0, pool="scratch")
        session.write(weights[names[0]].data)
        session.abort()
        view = self.client.status(pool="scratch")
        self.assertEqual(view["replicas"], [])
        # The same version publishes afterwards: nothing of the aborted one stayed.
        done = self.client.publish(weights, run="aborted", version=0, pool="scratch")
        self.assertFalse(done["idempotent"])
        self.assertTrue(done["claimed"])

    def test_large_requests_arrive_in_order_byte_for_byte(self):
        # Three 12 MiB tensors sent as 20 MiB requests (each handed on in
        # 8 MiB pieces, two requests in flight): then the CLI publishes the
        # same directory as the same version, which is idempotent only if
        # the stored bytes are exactly these.
        d = os.path.join(self.tmp, "large")
        os.makedirs(d, exist_ok=True)
        header, blobs, at = {}, [], 0
        for i in range(3):
            blob = os.urandom(12 << 20)
            header[f"t{i}"] = {"dtype": "U8", "shape": [len(blob)], "data_offsets": [at, at + len(blob)]}
            blobs.append(blob)
            at += len(blob)
        raw = json.dumps(header).encode()
        raw += b" " * ((8 - len(raw) % 8) % 8)
        with open(os.path.join(d, "model.safetensors"), "wb") as f:
            f.write(struct.pack("<Q", len(raw)) + raw)
            for b in blobs:
                f.write(b)
        done = self.client.publish(d, run="big", version=0, pool="order", chunk_bytes=20 << 20)
        self.assertFalse(done["idempotent"])
        cli = subprocess.run(
            [os.path.join(BIN, "stitch"), "--coordinator", self.node.coordinator, "publish",
             "--pool", "order", "--run", "big", "--version", "0", d],
            capture_output=True, text=True,
        )
        self.assertEqual(cli.returncode, 0, cli.stdout + cli.stderr)
        self.assertIn("already published", cli.stdout + cli.stderr)

    def test_a_checkpoints_files_are_kept_with_the_version_byte_for_byte(self):
        # The boot directory's config.json went with version 0 (publish of a
        # directory); a state dict's files are given; binary files travel as
        # base64. `stitch export` writes them back identical, and the CLI's
        # re-publish of the export is idempotent (same tensors, same files).
        with open(os.path.join(self.boot, "config.json"), "rb") as f:
            config = f.read()
        tokenizer = bytes(range(256)) * 300
        weights = read_safetensors(self.boot)
        done = self.client.publish(
            weights, run="files", version=0, pool="files",
            files={"config.json": config.decode(), "tokenizer.model": tokenizer},
        )
        self.assertFalse(done["idempotent"])
        out = os.path.join(self.tmp, "files-export")
        cli = subprocess.run(
            [os.path.join(BIN, "stitch"), "--coordinator", self.node.coordinator, "export",
             "--pool", "files", "--version", "files/0", "--out", out],
            capture_output=True, text=True,
        )
        self.assertEqual(cli.returncode, 0, cli.stdout + cli.stderr)
        with open(os.path.join(out, "config.json"), "rb") as f:
            self.assertEqual(f.read(), config)
        with open(os.path.join(out, "tokenizer.model"), "rb") as f:
            self.assertEqual(f.read(), tokenizer)
        again = self.client.publish(out, run="files", version=0, pool="files")
        self.assertTrue(again["idempotent"])
        # Other files under the same version are another content.
        with self.assertRaises(StitchError) as caught:
            self.client.publish(weights, run="files", version=0, pool="files",
                                files={"config.json": "{}"})
        self.assertEqual(caught.exception.status, 409)
        self.assertEqual(caught.exception.type, "VersionExists")
        for bad, why in (("../config.json", "file name"), ("model.safetensors", "index")):
            with self.assertRaises(StitchError) as caught:
                self.client.publish(weights, run="files", version=1, pool="files", files={bad: "x"})
            self.assertEqual(caught.exception.status, 400)
            self.assertIn(why, str(caught.exception))
        body = {"run_id": "files", "version": 1, "pool": "files",
                "tensors": [{"name": "a", "dtype": "U8", "shape": [1]}],
                "files": {"config.json": {"base64": "not base64!"}}}
        conn = http.client.HTTPConnection(self.node.publisher.split("//")[1])
        conn.request("POST", "/publish", json.dumps(body), {"Content-Type": "application/json"})
        answer = conn.getresponse()
        self.assertEqual(answer.status, 400)
        self.assertIn("base64", answer.read().decode())
        conn.close()

    def test_malformed_tensors_are_refused_naming_the_problem(self):
        with self.assertRaises(StitchError) as caught:
            self.client.open_session([("a", "F33", [2])], run="bad", version=0)
        self.assertEqual(caught.exception.status, 400)
        self.assertIn("F33", str(caught.exception))
        with self.assertRaises(StitchError) as caught:
            self.client.open_session([("b", "F32", [1]), ("a", "F32", [1])], run="bad", version=0)
        self.assertIn("ascending name order", str(caught.exception))
        with self.assertRaises(StitchError) as caught:
            self.client.open_session([("a", "F32", [2**62, 2**62])], run="bad", version=0)
        self.assertEqual(caught.exception.status, 400)
        # More bytes than the tensors listed.
        session = self.client.open_session([("a", "F32", [2])], run="bad", version=0)
        with self.assertRaises(StitchError) as caught:
            session.write(b"\x00" * 12)
            session.commit()
        self.assertEqual(caught.exception.status, 400)
        session.abort()
        # A third request while two are in flight is refused (bounded memory).
        # Session A holds its pool's publish queue (no bytes yet), so nothing
        # of session B behind it is consumed.
        blocker = self.client.open_session([("a", "U8", [4])], run="inflight-a", version=0, pool="inflight")
        session = self.client.open_session([("big", "U8", [3 << 20])], run="inflight-b", version=0, pool="inflight")
        host, port = self.node.publisher[len("http://"):].rsplit(":", 1)
        conns = [http.client.HTTPConnection(host, int(port), timeout=30) for _ in range(3)]
        piece = b"\x00" * (1 << 20)
        conns[0].request("PUT", f"/publish/{session.id}", body=piece)
        first = conns[0].getresponse()
        first.read()
        self.assertEqual(first.status, 200)
        conns[1].request("PUT", f"/publish/{session.id}", body=piece)  # waits on the first
        time.sleep(0.2)
        conns[2].request("PUT", f"/publish/{session.id}", body=piece)
        third = conns[2].getresponse()
        body = json.loads(third.read())
        self.assertEqual(third.status, 400)
        self.assertIn("two requests in flight", body["message"])
        session.abort()
        blocker.abort()
        for c in conns:
            c.close()
        # A bad request is JSON naming the field.
        with self.assertRaises(StitchError) as caught:
            self.client._pub().json("POST", "/publish", {"run_id": "x", "version": -1, "tensors": []})
        self.assertIn("'version'", str(caught.exception))


    def test_hostile_tensor_names_are_refused_naming_the_tensor(self):
        # Names a tensor could use to reach outside a staging or export
        # directory, or to break a log line: each refused with a 400 naming
        # the tensor, before any byte is read.
        for name, why in (("../../etc/passwd", "'..'"), ("/etc/passwd", "absolute"),
                          ("a/./b", "'.'"), ("a//b", "empty path component"),
                          ("a\\b", "backslash"), ("nul\x00byte", "control byte"),
                          ("x" * 1025, "longer than 1024")):
            with self.assertRaises(StitchError) as caught:
                self.client.open_session([(name, "U8", [1])], run="hostile", version=0, pool="hostile")
            self.assertEqual(caught.exception.status, 400, name)
            self.assertIn("tensor name", str(caught.exception), name)
            self.assertIn(why, str(caught.exception), name)
        # Bytes that are not UTF-8 cannot be a JSON string: the body is refused.
        host, port = self.node.publisher[len("http://"):].rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        body = (b'{"run_id": "hostile", "version": 0, "pool": "hostile", "tensors": '
                b'[{"name": "bad\xff\xfe", "dtype": "U8", "shape": [1]}]}')
        conn.request("POST", "/publish", body, {"Content-Type": "application/json"})
        answer = conn.getresponse()
        self.assertEqual(answer.status, 400)
        self.assertIn("UTF-8", answer.read().decode("utf-8", "replace"))
        conn.close()
        # Nothing of them was written anywhere under the node's directory.
        for root, dirs, files in os.walk(os.path.join(self.tmp, "node")):
            for entry in dirs + files:
                self.assertNotIn("passwd", entry)
                self.assertNotIn("hostile", entry)


class SessionLifetime(unittest.TestCase):
    def test_an_idle_session_expires_and_a_restart_mid_session_leaves_nothing(self):
        tmp = tempfile.mkdtemp(prefix="stitch-client-expiry-")
        node = Node(os.path.join(tmp, "node"), "publisher.session_idle_timeout=1", "replicas=0")
        try:
            weights, names, listing = booted(tmp)
            client = Client(publisher=node.publisher, gateway=node.gateway)
            # Silent past the idle timeout: dropped, named as such.
            session = client.open_session(listing, run="r", version=0)
            session.write(weights[names[0]].data)
            session._flush()
            time.sleep(3)
            with self.assertRaises(StitchError) as caught:
                session.write(weights[names[1]].data)
                session.commit()
            self.assertEqual(caught.exception.status, 404, str(caught.exception))
            self.assertIn("session_idle_timeout", str(caught.exception))
            client.close()
            # The node dies mid-session and comes back on the same store.
            session = client.open_session(listing, run="r", version=0)
            session.write(weights[names[0]].data)
            session._flush()
            node.proc.kill()
            node.proc.wait()
            node.log.close()
            with self.assertRaises(OSError):
                session.write(weights[names[1]].data)
                session.commit()
            node = Node(os.path.join(tmp, "node"), "publisher.session_idle_timeout=1", "replicas=0")
            client = Client(publisher=node.publisher, gateway=node.gateway)
            with self.assertRaises(StitchError) as caught:
                client._pub().json("PUT", f"/publish/{session.id}", b"x")
            self.assertEqual(caught.exception.status, 404)
            # Nothing of either session is visible: version 0 publishes afresh.
            done = client.publish(weights, run="r", version=0)
            self.assertTrue(done["claimed"])
            self.assertFalse(done["idempotent"])
            client.close()
        finally:
            node.stop()
            shutil.rmtree(tmp, ignore_errors=True)


# A publishing process that dies with a PUT in flight: ``whole`` sends the
# whole body and waits for the answer, ``half`` stops half-way through it;
# ``between`` (its session bound to its connection) sends nothing after its
# first, answered, PUT. Prints the session's id, then sleeps until it is
# killed.
DYING_CLIENT = r"""
import http.client, json, sys, time
from urllib.parse import urlsplit
from stitch_client import Client
url, pool, mode, listing, sizes = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4]), json.loads(sys.argv[5])
client = Client(publisher=url, abort_on_disconnect=mode == "between")
session = client.open_session([tuple(t) for t in listing], run="r", version=0, pool=pool)
session.write(bytes(sizes[0]))
session._flush()
if mode == "between":
    print(session.id, flush=True)
    time.sleep(600)
u = urlsplit(url)
conn = http.client.HTTPConnection(u.hostname, u.port)
conn.putrequest("PUT", f"/publish/{session.id}")
conn.putheader("Content-Length", str(sizes[1]))
conn.endheaders()
conn.send(bytes(sizes[1] if mode == "whole" else sizes[1] // 2))
print(session.id, flush=True)
time.sleep(600)
"""


class DyingClients(unittest.TestCase):
    def test_a_client_killed_mid_request_frees_its_session_at_once(self):
        # With the default session_idle_timeout (600 s) each dead client's
        # session would hold the pool's publish queue for ten minutes.
        tmp = tempfile.mkdtemp(prefix="stitch-client-dying-")
        node = Node(os.path.join(tmp, "node"), "replicas=0")
        try:
            weights, names, listing = booted(tmp)
            sizes = [len(weights[n].data) for n in names[:2]]
            client = Client(publisher=node.publisher, timeout=60)
            # The first session's publish holds the pool's queue (it waits for
            # bytes), so the dying clients' second PUTs stay unanswered.
            holder = client.open_session(listing, run="r", version=0, pool="busy")
            expect = {"whole": "before its PUT was answered",
                      "half": "in the middle of a PUT's body",
                      "between": "between requests"}
            ids = {}
            for mode in expect:
                p = subprocess.Popen(
                    [sys.executable, "-c", DYING_CLIENT, node.publisher, "busy", mode,
                     json.dumps(listing), json.dumps(sizes)],
                    stdout=subprocess.PIPE, text=True)
                ids[mode] = int(p.stdout.readline())
                time.sleep(1.0)  # the node reads what was sent
                p.kill()
                p.wait()
                p.stdout.close()
            deadline = time.monotonic() + 20
            while True:
                with open(node.log_path) as f:
                    log = f.read()
                if all(f"publish session {ids[m]} went away {expect[m]}" in log for m in expect):
                    break
                if time.monotonic() > deadline:
                    self.fail(f"sessions {ids} were not aborted:\n{log[-3000:]}")
                time.sleep(0.1)
            # Their slots are free at once, though their publishes are still
            # queued behind the holder's: with the holder, three dead
            # sessions would fill the node's four.
            done = client.publish(weights, run="r", version=0, pool="other")
            self.assertTrue(done["claimed"])
            holder.abort()
            # Nothing of the dead clients' sessions stands in the way.
            done = client.publish(weights, run="r", version=0, pool="busy")
            self.assertTrue(done["claimed"])
            self.assertFalse(done["idempotent"])
            client.close()
        finally:
            node.stop()
            shutil.rmtree(tmp, ignore_errors=True)


class ConnectionBoundSessions(unittest.TestCase):
    def test_a_bound_session_ends_with_its_connection_and_an_unbound_one_survives_a_reconnect(self):
        tmp = tempfile.mkdtemp(prefix="stitch-client-bound-")
        node = Node(os.path.join(tmp, "node"), "replicas=0")
        try:
            weights, names, listing = booted(tmp)
            u = urllib.parse.urlsplit(node.publisher)
            connect = lambda: http.client.HTTPConnection(u.hostname, u.port, timeout=60)

            def call(conn, method, path, body=None):
                conn.request(method, path, body)
                r = conn.getresponse()
                data = r.read()
                return r.status, (json.loads(data) if data else None)

            def open_on(conn, pool, **extra):
                body = {"pool": pool, "run_id": "r", "version": 0,
                        "tensors": [{"name": n, "dtype": d, "shape": list(sh)} for n, d, sh in listing]}
                body.update(extra)
                return call(conn, "POST", "/publish", json.dumps(body).encode())

            # Not bound (the default): the connection closes after an answered
            # PUT and the session goes on over a new one.
            first = connect()
            status, opened = open_on(first, "free")
            self.assertEqual(status, 201, opened)
            sid = opened["session"]
            self.assertEqual(call(first, "PUT", f"/publish/{sid}", bytes(weights[names[0]].data))[0], 200)
            first.close()
            second = connect()
            for n in names[1:]:
                self.assertEqual(call(second, "PUT", f"/publish/{sid}", bytes(weights[n].data))[0], 200)
            status, done = call(second, "POST", f"/publish/{sid}/commit")
            self.assertEqual(status, 200, done)
            self.assertTrue(done["claimed"])
            second.close()

            # Bound: the client closing the connection between requests aborts
            # the session at once, and the pool's publish queue is free.
            bound = connect()
            status, opened = open_on(bound, "bound", abort_on_disconnect=True)
            self.assertEqual(status, 201, opened)
            sid = opened["session"]
            self.assertEqual(call(bound, "PUT", f"/publish/{sid}", bytes(weights[names[0]].data))[0], 200)
            bound.close()
            deadline = time.monotonic() + 20
            said = f"publish session {sid} went away between requests"
            while True:
                with open(node.log_path) as f:
                    if said in f.read():
                        break
                if time.monotonic() > deadline:
                    self.fail(f"session {sid} was not aborted when its connection closed")
                time.sleep(0.1)
            late = connect()
            status, answer = call(late, "PUT", f"/publish/{sid}", bytes(weights[names[1]].data))
            self.assertGreaterEqual(status, 400, answer)
            late.close()
            client = Client(publisher=node.publisher, timeout=60)
            done = client.publish(weights, run="r", version=0, pool="bound")
            self.assertTrue(done["claimed"])

            # The flag is a boolean.
            conn = connect()
            status, answer = open_on(conn, "odd", abort_on_disconnect="yes")
            self.assertEqual(status, 400, answer)
            self.assertIn("abort_on_disconnect", answer["message"])
            # The node's four sessions taken: a fifth is told to retry (503,
            # Retry-After), not that it asked wrongly.
            opened = []
            for i in range(4):
                status, answer = open_on(conn, f"slot{i}")
                self.assertEqual(status, 201, answer)
                opened.append(answer["session"])
            conn.request("POST", "/publish", json.dumps(
                {"pool": "slot4", "run_id": "r", "version": 0,
                 "tensors": [{"name": n, "dtype": d, "shape": list(sh)} for n, d, sh in listing]}).encode())
            r = conn.getresponse()
            answer = json.loads(r.read())
            self.assertEqual(r.status, 503, answer)
            self.assertIn("too many publishes", answer["message"])
            self.assertTrue(r.getheader("Retry-After"))
            # The client asks again within its budget: without one it gives
            # up at once; with one it publishes once a session ends.
            with self.assertRaises(StitchError) as caught:
                client.publish(weights, run="r", version=0, pool="slot4", retry_budget=0)
            self.assertEqual(caught.exception.status, 503)
            result = {}
            waiting = threading.Thread(target=lambda: result.update(
                client.publish(weights, run="r", version=0, pool="slot4", retry_budget=60)))
            waiting.start()
            time.sleep(1.5)
            self.assertTrue(waiting.is_alive(), "the publish did not wait for a session")
            self.assertEqual(call(conn, "DELETE", f"/publish/{opened.pop()}")[0], 200)
            waiting.join(60)
            self.assertFalse(waiting.is_alive())
            self.assertTrue(result.get("claimed"), result)
            client.close()
            for sid in opened:
                self.assertEqual(call(conn, "DELETE", f"/publish/{sid}")[0], 200)
            conn.close()
        finally:
            node.stop()
            shutil.rmtree(tmp, ignore_errors=True)


class RetryAfter(unittest.TestCase):
    def test_a_retry_after_that_is_no_delay_in_seconds_waits_one_second(self):
        # A proxy in front may send an HTTP date; a broken peer anything.
        from stitch_client import _retry_after

        self.assertEqual(_retry_after({"retry-after": "3"}), 3.0)
        self.assertEqual(_retry_after({"retry-after": "0.5"}), 0.5)
        self.assertEqual(_retry_after({}), 1.0)
        for bad in ("Wed, 21 Oct 2015 07:28:00 GMT", "", "-5", "nan", "inf", "soon"):
            self.assertEqual(_retry_after({"retry-after": bad}), 1.0, bad)


class AdminToken(unittest.TestCase):
    def test_publishing_needs_the_admin_token(self):
        tmp = tempfile.mkdtemp(prefix="stitch-client-token-")
        node = Node(os.path.join(tmp, "node"), "admin.token=s3cret")
        try:
            boot = os.path.join(tmp, "boot")
            init_model(boot, 5)
            for token in (None, "wrong"):
                c = Client(publisher=node.publisher, token=token)
                with self.assertRaises(StitchError) as caught:
                    c.publish(boot, run="r", version=0)
                self.assertEqual(caught.exception.status, 401)
                c.close()
            good = Client(publisher=node.publisher, token="s3cret")
            self.assertEqual(good.publish(boot, run="r", version=0)["kind"], "anchor")
            good.close()
        finally:
            node.stop()
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    unittest.main()
