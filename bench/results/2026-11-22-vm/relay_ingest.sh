#!/bin/bash
# Verified ingest from a local relay: riptide relay (loopback) -> riptide serve; events/s of durable
# storage measured from serve's /metrics, between START (default 2,000) and N events stored.
# usage: relay_ingest.sh BIN FRAMES EVENTS [extra serve args]
#   FRAMES: the capture repeated (repeat_corpus.py beside this file), e.g. x2400 = 360,000 frames.
#   Optional: RELAYBIN (relay binary), RELAYWAIT (s for the relay to load FRAMES; 22 for x2400),
#   WINDOW (relay --window: at least the frame count), START, POLL (s between /metrics polls).
# Steady state (the server's in-memory tail full, fjall flushing), as in serve-5.md:
#   START=70000 WINDOW=400000 RELAYWAIT=22 ./relay_ingest.sh BIN /tmp/x2400.bin 340000
# Each poll forks curl, awk and date, ~9 ms of CPU here: at 0.05 s that took ~9% of this 2-core
# machine from the server being measured, so the default is 0.2 s (the rate is exact either way: events and time
# are both read at the two polls that bound the window).
BIN=$1; FRAMES=$2; N=$3; shift 3
C=${RIPTIDE_CORPUS:-../shared/corpus}
D=$(mktemp -d)
RP=$((7100 + RANDOM % 500)); SP=$((RP + 600))
${RELAYBIN:-$BIN} relay --replay $FRAMES --listen 127.0.0.1:$RP --window ${WINDOW:-100000} >/dev/null 2>&1 &
R=$!
sleep ${RELAYWAIT:-4}
start_cpu() { awk '{print $14+$15}' /proc/$1/stat; }
$BIN serve --upstream ws://127.0.0.1:$RP/xrpc/com.atproto.sync.subscribeRepos --upstream-cursor 0 \
  --did-docs $C/jetstream-2026-07/did_docs.json --zstd-dictionary $C/jetstream-dictionaries/legacy_subscribe.zdict \
  --data $D --listen 127.0.0.1:$SP "$@" >/dev/null 2>&1 &
S=$!
t0=""; c0=""; r0=""
while true; do
  n=$(curl -s 127.0.0.1:$SP/metrics 2>/dev/null | awk '/^riptide_events_stored_total/{print $2}')
  n=${n:-0}
  now=$(date +%s.%N)
  if [ -z "$t0" ] && [ "${n%.*}" -ge ${START:-2000} ]; then t0=$now; n0=$n; c0=$(start_cpu $S); r0=$(start_cpu $R); fi
  if [ -n "$t0" ] && [ "${n%.*}" -ge "$N" ]; then
    c1=$(start_cpu $S); r1=$(start_cpu $R)
    python3 -c "
n0,n1,t0,t1=$n0,$n,$t0,$now
ev=n1-n0; dt=t1-t0
print(f'{ev:.0f} events in {dt:.2f}s: {ev/dt:.0f} events/s; serve {($c1-$c0)*1e4/ev:.1f} CPU-us/event, relay {($r1-$r0)*1e4/ev:.1f} CPU-us/event')"
    break
  fi
  sleep ${POLL:-0.2}
done
kill $S $R; wait $S $R 2>/dev/null; rm -rf $D
