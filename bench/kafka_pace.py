#!/usr/bin/env python3
"""Pacing through Kafka backfill workers (docs/kafka.md, "Backfill workers"): three `riptide
backfill --publish` workers, each bound to its own loopback address (127.0.0.2-4), crawl a
`riptide sim --hosts 6 --seed 3 --limit-get-repo RATE` network of `riptide gen --seed 11
--accounts 120 --events 400 --repos`; prints one JSON line: the wall, the largest host's time
(from its worker's log lines) against its bound (accounts / RATE), and the busiest work
partition's (hosts of one partition are crawled one after another).

usage: bench/kafka_pace.py BIN BOOTSTRAP RATE [PARTITIONS]
  BIN: a release `riptide`; BOOTSTRAP: a running Kafka (deploy/kafka/start DIR prints it).
Scratch in /tmp/riptide-kafka-pace-RATE (the generated network is kept for the next run)."""
import os, re, subprocess, sys, time, shutil, datetime, json
B, boot, R = sys.argv[1], sys.argv[2], int(sys.argv[3])
P = int(sys.argv[4]) if len(sys.argv) > 4 else 6
W = f"/tmp/riptide-kafka-pace-{R}"
os.makedirs(W, exist_ok=True)
if not os.path.exists(f"{W}/net"): subprocess.run([B, "gen", "--seed", "11", "--accounts", "120", "--events", "400", "--repos", "--out", f"{W}/net"], check=True, stdout=subprocess.DEVNULL)
sim = subprocess.Popen([B, "sim", "--from", f"{W}/net", "--listen", "127.0.0.1:0", "--hosts", "6", "--seed", "3",
                        "--limit-get-repo", str(R), "--manifest", f"{W}/manifest.json"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
base = sim.stdout.readline().strip()
assert base.startswith("http://"), base
topic = f"pace{R}-{P}-{int(time.time())}"
url = f"kafka://{boot}/{topic}?partitions={P}"
t0 = time.time()
ws = []
for i in (2, 3, 4):
    log = open(f"{W}/w{i}.log", "w")
    ws.append(subprocess.Popen([B, "backfill", "--relay", base, "--plc-url", base, "--publish", url,
                                "--get-repo-rate", str(R), "--bind", f"127.0.0.{i}"], stdout=subprocess.DEVNULL, stderr=log))
for w in ws: assert w.wait() == 0
wall = time.time() - t0
sim.terminate()
ts = lambda l: datetime.datetime.fromisoformat(l.split()[0].replace("Z", "+00:00")).timestamp()
start, end, n, part = {}, {}, {}, {}
for i in (2, 3, 4):
    for l in open(f"{W}/w{i}.log"):
        l = re.sub(r"\x1b\[[0-9;]*m", "", l)
        h = re.search(r'host="([^"]+)"', l)
        if not h: continue
        h = h.group(1)
        if "crawling a host" in l:
            start.setdefault(h, ts(l))
            part[h] = int(re.search(r"partition=(\d+)", l).group(1))
        if "host finished" in l:
            end[h] = ts(l)
            ok = int(re.search(r"ok=(\d+)", l).group(1))
            failed = sum(int(x) for x in re.findall(r'"[a-z_]+": (\d+)', l))
            n[h] = (ok, failed, i)
big = max(n, key=lambda h: n[h][0] + n[h][1])
N = n[big][0] + n[big][1]
took = end[big] - start[big]
out = dict(rate=R, wall=round(wall, 2), largest_host=big, accounts=N, worker=n[big][2], host_secs=round(took, 2),
           bound=N / R, host_ratio=round(took / (N / R), 3), host_ratio_first_window=round(took / ((N - R) / R), 3),
           wall_ratio=round(wall / (N / R), 3), hosts={h: dict(accounts=sum(n[h][:2]), secs=round(end[h]-start[h], 2), worker=n[h][2]) for h in n})
per = {}
for h in n: per.setdefault(part[h], []).append(h)
busiest = max(per, key=lambda p: sum(sum(n[h][:2]) for h in per[p]))
acc = sum(sum(n[h][:2]) for h in per[busiest])
out.update(partitions=P, busiest_partition=busiest, busiest_accounts=acc, busiest_secs=round(max(end[h] for h in per[busiest]) - min(start[h] for h in per[busiest]), 2),
           busiest_bound=acc / R, wall_over_busiest_bound=round(wall / (acc / R), 3),
           load=open("/proc/loadavg").read().split()[:3], at=datetime.datetime.utcnow().isoformat(timespec="seconds"))
del out["hosts"]
print(json.dumps(out))
