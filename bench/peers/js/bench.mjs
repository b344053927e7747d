// The JavaScript peers of riptide's cross-SDK benchmark (see bench/README.md): `atcute`
// (@atcute/cbor, @atcute/car, @atcute/repo, @atcute/crypto) and `atproto-ts` (@atproto/repo,
// @atproto/crypto, @atproto/lex-cbor: the official TypeScript implementation). One summary row
// (JSON) per benchmark on stdout.
//
// usage: node bench.mjs SDK [--warmup N --passes N] decode FILE LABEL [--no-verify] | sigs FILE | repo FILE LABEL
import { readFileSync } from 'node:fs';

import * as ACar from '@atcute/car';
import * as ACbor from '@atcute/cbor';
import * as ACrypto from '@atcute/crypto';
import * as ARepo from '@atcute/repo';
import * as LexCbor from '@atproto/lex-cbor';
import * as TCrypto from '@atproto/crypto';
import * as TRepo from '@atproto/repo';

const argv = process.argv.slice(2);
const sdk = argv.shift();
let warmup = 2;
let passes = 5;
let repeat = 1;
const args = [];
for (let i = 0; i < argv.length; i++) {
  if (argv[i] === '--warmup') warmup = Number(argv[++i]);
  else if (argv[i] === '--passes') passes = Number(argv[++i]);
  else if (argv[i] === '--repeat') repeat = Number(argv[++i]);
  else args.push(argv[i]);
}

const emit = (benchmark, variant, unit, [median, min, max], bpf, errors) =>
  console.log(JSON.stringify({ benchmark, sdk, variant, unit, median, min, max, blocks_per_frame: bpf ?? null, errors }));

async function measure(work, f) {
  for (let i = 0; i < warmup; i++) await f();
  const rates = [];
  for (let i = 0; i < passes; i++) {
    const t = process.hrtime.bigint();
    await f();
    rates.push(work / (Number(process.hrtime.bigint() - t) / 1e9));
  }
  rates.sort((a, b) => a - b);
  const n = rates.length;
  const med = n % 2 ? rates[(n - 1) / 2] : (rates[n / 2 - 1] + rates[n / 2]) / 2;
  return [med, rates[0], rates[n - 1]];
}

function frames(buf) {
  const dv = new DataView(buf.buffer, buf.byteOffset, buf.byteLength);
  const n = dv.getUint32(0);
  let off = 4;
  const out = [];
  for (let i = 0; i < n; i++) {
    const l = dv.getUint32(off);
    out.push(buf.subarray(off + 4, off + 4 + l));
    off += 4 + l;
  }
  return out;
}

function sigEntries(buf) {
  const dv = new DataView(buf.buffer, buf.byteOffset, buf.byteLength);
  const n = dv.getUint32(0);
  let off = 4;
  const out = [];
  for (let i = 0; i < n; i++) {
    const k256 = buf[off] === 1;
    let l = dv.getUint16(off + 1);
    const signed = buf.subarray(off + 3, off + 3 + l);
    off += 3 + l;
    l = dv.getUint16(off);
    const pubkey = buf.subarray(off + 2, off + 2 + l);
    off += 2 + l;
    out.push({ k256, signed, pubkey });
  }
  return out;
}

// ---- atcute: header and payload with @atcute/cbor, CAR with @atcute/car (no hash check), every
// block with @atcute/cbor.
function atcuteFrame(f) {
  const [header, rest] = ACbor.decodeFirst(f);
  if (header.op !== 1) throw new Error('error frame');
  const body = ACbor.decode(rest);
  if (header.t !== '#commit' && header.t !== '#sync') return 0;
  const car = ACar.fromUint8Array(ACbor.fromBytes(body.blocks));
  let n = 0;
  for (const entry of car) {
    ACbor.decode(entry.bytes);
    n++;
  }
  return n;
}

// ---- atproto-ts: header and payload with @atproto/lex-cbor, CAR with @atproto/repo readCar
// (which checks every block's CID unless skipCidVerification), every block with lex-cbor.
async function tsFrame(f, verify) {
  const [header, body] = LexCbor.decodeAll(f);
  if (header.op !== 1) throw new Error('error frame');
  if (header.t !== '#commit' && header.t !== '#sync') return 0;
  const car = await TRepo.readCar(body.blocks, { skipCidVerification: !verify });
  let n = 0;
  for (const { bytes } of car.blocks.entries()) {
    LexCbor.decode(bytes);
    n++;
  }
  return n;
}

async function decode(file, label, verify) {
  const fs = frames(readFileSync(file));
  const one = sdk === 'atcute' ? async (f) => atcuteFrame(f) : (f) => tsFrame(f, verify);
  let blocks = 0;
  let errors = 0;
  for (const f of fs) {
    try {
      blocks += await one(f);
    } catch {
      errors++;
    }
  }
  const r = await measure(fs.length, async () => {
    for (const f of fs) {
      try {
        await one(f);
      } catch {}
    }
  });
  emit(verify ? 'decode' : 'decode-unverified', label, 'frames/s', r, blocks / fs.length, errors);
}

async function sigs(file) {
  const entries = sigEntries(readFileSync(file));
  let full;
  if (sdk === 'atcute') {
    // key imported from its raw bytes every time, commit decoded and re-encoded without `sig`.
    const cls = (e) => (e.k256 ? ACrypto.Secp256k1PublicKey : ACrypto.P256PublicKey);
    full = async (e) => {
      const c = ACbor.decode(e.signed);
      const sig = ACbor.fromBytes(c.sig);
      delete c.sig;
      const key = await cls(e).importRaw(e.pubkey);
      return key.verify(sig, ACbor.encode(c));
    };
  } else {
    const didKeys = new Map(
      entries.map((e) => [e, TCrypto.formatDidKey(e.k256 ? TCrypto.SECP256K1_JWT_ALG : TCrypto.P256_JWT_ALG, e.pubkey)]),
    );
    full = async (e) => {
      const c = LexCbor.decode(e.signed);
      const sig = c.sig;
      delete c.sig;
      return TCrypto.verifySignature(didKeys.get(e), LexCbor.encode(c), sig);
    };
  }
  const good = [];
  for (const e of entries) {
    try {
      if (await full(e)) good.push(e);
    } catch {}
  }
  const errors = entries.length - good.length;
  const r = await measure(good.length, async () => {
    let ok = 0;
    for (const e of good) if (await full(e)) ok++;
    if (ok !== good.length) throw new Error(`verified ${ok} of ${good.length}`);
  });
  emit('sigs', 'full', 'verifies/s', r, null, errors);
}

async function repo(file, label) {
  const bytes = readFileSync(file);
  const one =
    sdk === 'atcute'
      ? async () => {
          // @atcute/repo: CAR (no hash check), commit, MST walk to every record.
          let n = 0;
          for (const entry of ARepo.fromUint8Array(bytes)) n += entry.rkey.length > 0;
          return n;
        }
      : async () => TRepo.verifyRepoCar(bytes);
  let errors = 0;
  try {
    await one();
  } catch (e) {
    console.error(`${sdk} repo: ${e}`);
    errors = 1;
  }
  const r = await measure((bytes.length * repeat) / 1e6, async () => {
    for (let i = 0; i < repeat; i++) {
      try {
        await one();
      } catch {}
    }
  });
  emit('repo', label, 'MB/s', r, null, errors);
}

const [cmd, file, label, ...rest] = args;
if (cmd === 'decode') await decode(file, label, !rest.includes('--no-verify'));
else if (cmd === 'sigs') await sigs(file);
else if (cmd === 'repo') await repo(file, label);
else {
  console.error('usage: node bench.mjs SDK [--warmup N --passes N] decode FILE LABEL [--no-verify] | sigs FILE | repo FILE LABEL');
  process.exit(2);
}
