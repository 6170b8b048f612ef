"""precise-prefix routing from the engines' own KV events, through a real
pdgw and three pdgw-sim engines publishing as vLLM does.

Upstream facts (vllm-project/vllm): vllm/config/kv_events.py spells
--kv-events-config (enable_kv_cache_events, publisher, endpoint,
replay_endpoint, topic); vllm/distributed/kv_events.py the wire: a PUB
sending [topic, seq (8-byte big-endian), msgpack batch], the batch an
array [ts, events, dp_rank] with ["BlockStored", ...] events in older
vLLM (array_like structs), a map {ts, events, data_parallel_rank} with
{"type": "BlockStored", ...} events in some, and today an array batch of
such maps (tests/v1/core/test_kv_events_contract.py). A GPU BlockStored
carries extra_keys, one entry per block (vllm/v1/core/block_pool.py
cache_full_blocks), the request's cache_salt folded into the first block's
(vllm/v1/core/kv_cache_utils.py generate_block_hash_extra_keys); cache_salt
is a request body field (vllm/entrypoints/openai/completion/protocol.py).

- the sims' events, replayed and live, decode with python3-msgpack into
  vLLM's shapes, both layouts;
- three sims warmed directly (pdgw never saw those requests) with three
  prompt families: each follow-up through pdgw goes to the sim holding its
  prefix;
- after the prefix is evicted on its first home and cached on another,
  follow-ups go to the new home;
- one prompt cached under three salts (none, "a", "b") on three sims: a
  follow-up goes to the sim holding it under the request's own salt.
"""

import json
import os
import tempfile
import time

import msgpack
import zmq

import pdgwtest as t

MODEL = "sim-model"
BLOCK = 16


def tokens(family, n, salt=0):
    return [1000 + family * 7919 + salt * 104729 + i for i in range(n)]


def successes(port):
    status, _, body = t.request("GET", port, "/metrics", timeout=5)
    assert status == 200, status
    return sum(float(line.rsplit(" ", 1)[1]) for line in body.decode().splitlines()
               if line.startswith("vllm:request_success_total"))


def complete(port, prompt, max_tokens=1, salt=None):
    req = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens}
    if salt is not None:
        req["cache_salt"] = salt
    status, _, body, raw = t.post_json(port, "/v1/completions", req, timeout=30)
    assert status == 200, (status, raw[:300])
    return body


class Fleet:
    def __init__(self, layouts=("map", "array", "map"), capacity=1024, sim_args=()):
        self.ports, self.ev_ports, self.rp_ports, self.sims = [], [], [], []
        for i, layout in enumerate(layouts):
            self._start_sim(i, layout, capacity, sim_args)
        self.gw_port = t.free_port()
        self.cfg = tempfile.NamedTemporaryFile("w", prefix="pdgw-kvev-", suffix=".yaml",
                                               delete=False)
        lines = [f'listen: "127.0.0.1:{self.gw_port}"', "workers: 2", "protocol: neutral",
                 "prefill_policy: precise-prefix", "decode_policy: precise-prefix",
                 "health_interval: 500ms", "health_timeout: 500ms",
                 "metrics_scrape_interval: 500ms", "access_log: false", "instances:"]
        for i, port in enumerate(self.ports):
            lines += [f"  - id: s{i}", f"    url: http://127.0.0.1:{port}", "    role: both",
                      f'    kv_events_endpoint: "tcp://127.0.0.1:{self.ev_ports[i]}"',
                      f'    kv_events_replay_endpoint: "tcp://127.0.0.1:{self.rp_ports[i]}"']
        self.cfg.write("\n".join(lines) + "\n")
        self.cfg.close()
        self.gw = t.Proc("pdgw", [t.binary("pdgw"), "--config", self.cfg.name])
        t.wait_http(self.gw_port, "/ready", timeout=15, proc=self.gw)

    def _start_sim(self, i, layout, capacity, sim_args, attempts=3):
        """Sim <i> on ports picked now. A picked port can be taken by someone else before the
        sim binds it (picking releases it): then the sim is started again on new ones."""
        for attempt in range(attempts):
            port, ev, rp = t.free_port(), t.free_port(), t.free_port()
            kv_cfg = {"enable_kv_cache_events": True, "publisher": "zmq",
                      "endpoint": f"tcp://*:{ev}", "replay_endpoint": f"tcp://*:{rp}",
                      "topic": "kv"}
            p = t.Proc(f"sim{i}", [t.binary("pdgw-sim"), "--role", "both", "--port", str(port),
                                   "--ttft-ms", "1", "--tpot-ms", "1", "--model", MODEL,
                                   "--block-size", str(BLOCK),
                                   "--kv-capacity-tokens", str(capacity),
                                   "--kv-events-config", json.dumps(kv_cfg),
                                   "--kv-events-layout", layout] + list(sim_args))
            try:
                t.wait_http(port, "/health", timeout=10, proc=p)
            except RuntimeError:
                out = p.output()
                in_use = "in use" in out or "cannot listen" in out
                p.kill()
                if in_use and attempt + 1 < attempts:
                    continue
                raise
            self.ports.append(port)
            self.ev_ports.append(ev)
            self.rp_ports.append(rp)
            self.sims.append(p)
            return

    def close(self):
        for p in self.sims + [self.gw]:
            p.kill()
        os.unlink(self.cfg.name)

    def gw_metric(self, name):
        _, _, body = t.request("GET", self.gw_port, "/metrics", timeout=5)
        return t.metric_value(body.decode(), name) or 0.0

    def wait_events(self, at_least, timeout=10):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.gw_metric("pdgw_kv_events_total") >= at_least:
                return
            time.sleep(0.05)
        raise TimeoutError(f"pdgw saw {self.gw_metric('pdgw_kv_events_total')} KV events")

    def wait_synced(self, timeout=15):
        """Until pdgw has applied every KV-event batch the engines published so far."""
        published = sum(t.metric_value(t.request("GET", p, "/metrics", timeout=5)[2].decode(),
                                       "sim_kv_event_batches_total") or 0.0
                        for p in self.ports)
        deadline = time.time() + timeout
        while self.gw_metric("pdgw_kv_event_batches_total") < published:
            if time.time() > deadline:
                raise TimeoutError(f"pdgw applied {self.gw_metric('pdgw_kv_event_batches_total')}"
                                   f" of {published} KV-event batches")
            time.sleep(0.05)

    def wait_settled(self, timeout=15):
        """Until pdgw has scraped every engine since now and sees them all idle: the score
        mixes the cached fraction with load, and a scrape taken while an engine was still
        busy with a warm-up prompt would weigh it down until the next scrape."""
        since = time.time()
        deadline = since + timeout
        seen = None
        while time.time() < deadline:
            status, _, raw = t.request("GET", self.gw_port, "/admin/instances", timeout=5)
            assert status == 200, status
            loads = [i["load"] for i in json.loads(raw)]
            scraped = [ld["scraped"] for ld in loads]
            fresh = all(sc and sc["age_ms"] / 1000.0 < time.time() - since for sc in scraped)
            idle = all(sc and sc["running"] == 0 and sc["waiting"] == 0 for sc in scraped)
            seen = loads
            if fresh and idle and len({ld["score"] for ld in loads}) == 1:
                return
            time.sleep(0.05)
        raise TimeoutError(f"engines not seen idle: {seen}")

    def routed_to(self, prompt, salt=None):
        self.wait_settled()
        before = [successes(p) for p in self.ports]
        complete(self.gw_port, prompt, salt=salt)
        after = [successes(p) for p in self.ports]
        got = [i for i in range(len(self.ports)) if after[i] > before[i]]
        assert len(got) == 1, (before, after)
        return got[0]


def replay(ctx, port, start=0):
    """Batches from <start> on, asked of the replay ROUTER as a subscriber does."""
    d = ctx.socket(zmq.DEALER)
    d.connect(f"tcp://127.0.0.1:{port}")
    d.send_multipart([b"", start.to_bytes(8, "big")])
    out = []
    while True:
        assert d.poll(5000), "replay answer missing"
        frames = d.recv_multipart()
        assert frames[0] == b"" and len(frames) == 3, frames
        seq = int.from_bytes(frames[1], "big", signed=True)
        if seq == -1:
            assert frames[2] == b""
            d.close(linger=0)
            return out
        out.append((seq, frames[2]))


def test_sim_publishes_vllm_format():
    """Every layout exactly as vLLM's structs encode them, live and replayed."""
    fleet = Fleet(layouts=("map", "array", "current"))
    ctx = zmq.Context()
    try:
        prompt = tokens(1, 3 * BLOCK + 5)
        for port in fleet.ports:
            complete(port, prompt)
        for i, rport in enumerate(fleet.rp_ports):
            batches = replay(ctx, rport)
            assert [seq for seq, _ in batches] == list(range(len(batches))) and batches
            batch = msgpack.unpackb(batches[0][1], raw=False)
            if i == 2:
                # today's wire: [ts, [map events], dp_rank], extra_keys per block and the
                # group the blocks belong to
                assert isinstance(batch, list) and len(batch) == 3, batch
                assert isinstance(batch[0], float) and batch[2] == 0
                ev = batch[1][0]
                assert set(ev) == {"type", "block_hashes", "parent_block_hash", "token_ids",
                                   "block_size", "lora_id", "medium", "lora_name",
                                   "extra_keys", "group_idx", "kv_cache_spec_kind"}, ev
                assert ev["type"] == "BlockStored" and ev["parent_block_hash"] is None
                assert ev["token_ids"] == prompt[:3 * BLOCK] and len(ev["block_hashes"]) == 3
                assert ev["extra_keys"] == [None, None, None]
                assert ev["group_idx"] == 0 and ev["kv_cache_spec_kind"] == "full_attention"
                assert ev["lora_id"] is None and ev["lora_name"] is None
            elif i == 0:
                assert isinstance(batch, dict), batch
                assert set(batch) == {"ts", "events", "data_parallel_rank"}
                ev = batch["events"][0]
                assert ev["type"] == "BlockStored"
                assert ev["parent_block_hash"] is None
                assert ev["block_size"] == BLOCK and ev["medium"] == "GPU"
                assert ev["token_ids"] == prompt[:3 * BLOCK]
                assert len(ev["block_hashes"]) == 3
                assert all(isinstance(h, int) for h in ev["block_hashes"])
            else:
                assert isinstance(batch, list) and len(batch) == 3, batch
                ev = batch[1][0]
                assert ev[0] == "BlockStored"
                hashes, parent, toks, bs, lora_id, medium, lora_name = ev[1:8]
                assert parent is None and bs == BLOCK and medium == "GPU"
                assert toks == prompt[:3 * BLOCK] and len(hashes) == 3
        # a salted prompt: the salt is the first block's extra key and changes every hash
        # of the chain (each folds its parent); the same salt again is a hit, no new event
        salted = tokens(3, 2 * BLOCK)
        complete(fleet.ports[2], salted)
        complete(fleet.ports[2], salted, salt="tenant-a")
        complete(fleet.ports[2], salted, salt="tenant-a")
        stored = [ev for _, raw in replay(ctx, fleet.rp_ports[2])
                  for ev in msgpack.unpackb(raw, raw=False)[1]
                  if ev["type"] == "BlockStored" and ev["token_ids"] == salted]
        assert [ev["extra_keys"] for ev in stored] == [[None, None], [["tenant-a"], None]]
        assert not set(stored[0]["block_hashes"]) & set(stored[1]["block_hashes"])
        status, _, _, raw = t.post_json(fleet.ports[2], "/v1/completions",
                                        {"model": MODEL, "prompt": salted, "cache_salt": ""})
        assert status == 400 and b"cache_salt" in raw, (status, raw)
        # live: [topic, 8-byte seq, payload]; a SUB misses what was sent
        # before it joined, so new prompts are sent until one arrives
        s = ctx.socket(zmq.SUB)
        s.setsockopt(zmq.SUBSCRIBE, b"")
        s.connect(f"tcp://127.0.0.1:{fleet.ev_ports[0]}")
        for k in range(100):
            complete(fleet.ports[0], tokens(2, 2 * BLOCK, salt=k))
            if s.poll(100):
                break
        topic, seq, payload = s.recv_multipart()
        assert topic == b"kv" and len(seq) == 8 and int.from_bytes(seq, "big") >= 1
        assert msgpack.unpackb(payload, raw=False)["events"][0]["type"] == "BlockStored"
        s.close(linger=0)
    finally:
        ctx.destroy(linger=0)
        fleet.close()


def test_follow_ups_go_where_the_prefix_is():
    fleet = Fleet()
    try:
        # warm each sim directly with its own family (pdgw never sees these)
        for i, port in enumerate(fleet.ports):
            complete(port, tokens(i, 12 * BLOCK))
        fleet.wait_events(3)
        # three events can be counted while one engine's batch is still on its way: wait
        # until every warm-up block (12 per engine) is in pdgw's index
        deadline = time.time() + 15
        while fleet.gw_metric("pdgw_kv_index_blocks") < 36 and time.time() < deadline:
            time.sleep(0.05)
        for rnd in range(3):
            for fam in range(3):
                follow = tokens(fam, 12 * BLOCK) + tokens(9, 20, salt=rnd * 3 + fam)
                assert fleet.routed_to(follow) == fam, (rnd, fam)
        assert fleet.gw_metric("pdgw_kv_index_blocks") >= 36

        # evict family 0 on sim0 (two prompts filling its 1024-token cache),
        # then cache it on sim2: follow-ups move with it
        removed = fleet.gw_metric("pdgw_kv_events_total")
        for k in range(2):
            complete(fleet.ports[0], tokens(20 + k, 60 * BLOCK))
        complete(fleet.ports[2], tokens(0, 12 * BLOCK))
        fleet.wait_events(removed + 3)
        fleet.wait_synced()
        follow = tokens(0, 12 * BLOCK) + tokens(9, 20, salt=99)
        assert fleet.routed_to(follow) == 2
        for rnd in range(3):
            follow = tokens(0, 12 * BLOCK) + tokens(9, 20, salt=200 + rnd)
            assert fleet.routed_to(follow) == 2
        assert fleet.gw_metric("pdgw_kv_event_bad_total") == 0
    finally:
        fleet.close()


def test_cache_salt_decides_the_hit():
    """The same prompt is a different prefix under another cache_salt: pdgw passes the
    request's salt to precise-prefix and keys the engines' blocks by their extra_keys."""
    fleet = Fleet(layouts=("current", "current", "current"))
    try:
        shared = tokens(5, 12 * BLOCK)
        salts = [None, "tenant-a", "tenant-b"]
        for port, salt in zip(fleet.ports, salts):  # warmed directly: pdgw never saw these
            complete(port, shared, salt=salt)
        deadline = time.time() + 15
        while fleet.gw_metric("pdgw_kv_index_blocks") < 36 and time.time() < deadline:
            time.sleep(0.05)
        assert fleet.gw_metric("pdgw_kv_index_blocks") >= 36
        for rnd in range(2):
            for home, salt in enumerate(salts):
                follow = shared + tokens(9, 20, salt=10 * rnd + home)
                assert fleet.routed_to(follow, salt=salt) == home, (rnd, salt)
        assert fleet.gw_metric("pdgw_kv_event_bad_total") == 0
    finally:
        fleet.close()


if __name__ == "__main__":
    t.run([test_sim_publishes_vllm_format, test_follow_ups_go_where_the_prefix_is,
           test_cache_salt_decides_the_hit])
