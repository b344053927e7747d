// The indigo peer of riptide's cross-SDK benchmark (see bench/README.md).
//
// It does the work of shared/docs/formats.md with bluesky-social/indigo's own building blocks and
// prints one summary row (JSON) per benchmark on stdout:
//
//	decode FILE LABEL  frame header and payload (cbor-gen), CAR via ipld/go-car (which checks the
//	                   SHA-256 of every block), every block decoded by go-ipld-cbor
//	sigs FILE          atproto/repo Commit decode + atproto/atcrypto verify, three tiers
//	repo FILE LABEL    atproto/repo LoadRepoFromCAR, MST walk, MST rebuilt and its root compared
package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"time"

	comatproto "github.com/bluesky-social/indigo/api/atproto"
	"github.com/bluesky-social/indigo/atproto/atcrypto"
	"github.com/bluesky-social/indigo/atproto/repo"
	"github.com/bluesky-social/indigo/atproto/repo/mst"
	"github.com/bluesky-social/indigo/events"
	cid "github.com/ipfs/go-cid"
	cbornode "github.com/ipfs/go-ipld-cbor"
	car "github.com/ipld/go-car"
)

var warmup = flag.Int("warmup", 2, "warm-up passes")
var passes = flag.Int("passes", 5, "measured passes")
var repeat = flag.Int("repeat", 1, "repo: verifications per pass")

type row struct {
	Benchmark      string   `json:"benchmark"`
	SDK            string   `json:"sdk"`
	Variant        string   `json:"variant"`
	Unit           string   `json:"unit"`
	Median         float64  `json:"median"`
	Min            float64  `json:"min"`
	Max            float64  `json:"max"`
	BlocksPerFrame *float64 `json:"blocks_per_frame"`
	Errors         int      `json:"errors"`
}

func emit(r row) {
	b, _ := json.Marshal(r)
	fmt.Println(string(b))
}

// stats runs warm-up and measured passes of f and returns rates work/second.
func stats(work float64, f func()) (med, lo, hi float64) {
	for i := 0; i < *warmup; i++ {
		f()
	}
	rates := make([]float64, 0, *passes)
	for i := 0; i < *passes; i++ {
		t := time.Now()
		f()
		rates = append(rates, work/time.Since(t).Seconds())
	}
	sort.Float64s(rates)
	n := len(rates)
	med = rates[n/2]
	if n%2 == 0 {
		med = (rates[n/2-1] + rates[n/2]) / 2
	}
	return med, rates[0], rates[n-1]
}

func readFrames(path string) [][]byte {
	data, err := os.ReadFile(path)
	if err != nil {
		panic(err)
	}
	n := binary.BigEndian.Uint32(data)
	off := 4
	frames := make([][]byte, 0, n)
	for i := uint32(0); i < n; i++ {
		l := int(binary.BigEndian.Uint32(data[off:]))
		off += 4
		frames = append(frames, data[off:off+l])
		off += l
	}
	return frames
}

// decodeCAR reads every block (go-car checks each block's hash) and decodes it with go-ipld-cbor.
func decodeCAR(b []byte) (int, error) {
	cr, err := car.NewCarReader(bytes.NewReader(b))
	if err != nil {
		return 0, err
	}
	n := 0
	for {
		blk, err := cr.Next()
		if err == io.EOF {
			return n, nil
		}
		if err != nil {
			return n, err
		}
		var v interface{}
		if err := cbornode.DecodeInto(blk.RawData(), &v); err != nil {
			return n, err
		}
		n++
	}
}

func decodeFrame(f []byte) (int, error) {
	r := bytes.NewReader(f)
	var hdr events.EventHeader
	if err := hdr.UnmarshalCBOR(r); err != nil {
		return 0, err
	}
	if hdr.Op != 1 {
		return 0, errors.New("error frame")
	}
	switch hdr.MsgType {
	case "#commit":
		var evt comatproto.SyncSubscribeRepos_Commit
		if err := evt.UnmarshalCBOR(r); err != nil {
			return 0, err
		}
		return decodeCAR(evt.Blocks)
	case "#sync":
		var evt comatproto.SyncSubscribeRepos_Sync
		if err := evt.UnmarshalCBOR(r); err != nil {
			return 0, err
		}
		return decodeCAR(evt.Blocks)
	case "#identity":
		var evt comatproto.SyncSubscribeRepos_Identity
		return 0, evt.UnmarshalCBOR(r)
	case "#account":
		var evt comatproto.SyncSubscribeRepos_Account
		return 0, evt.UnmarshalCBOR(r)
	default:
		return 0, fmt.Errorf("unknown type %q", hdr.MsgType)
	}
}

func benchDecode(path, label string) {
	frames := readFrames(path)
	blocks, errs := 0, 0
	for _, f := range frames {
		n, err := decodeFrame(f)
		blocks += n
		if err != nil {
			errs++
		}
	}
	med, lo, hi := stats(float64(len(frames)), func() {
		for _, f := range frames {
			decodeFrame(f)
		}
	})
	bpf := float64(blocks) / float64(len(frames))
	emit(row{"decode", "indigo", label, "frames/s", med, lo, hi, &bpf, errs})
}

type sigEntry struct {
	k256     bool
	signed   []byte
	pubkey   []byte
	unsigned []byte
	sig      []byte
	key      atcrypto.PublicKey
}

func parseKey(k256 bool, b []byte) (atcrypto.PublicKey, error) {
	if k256 {
		return atcrypto.ParsePublicBytesK256(b)
	}
	return atcrypto.ParsePublicBytesP256(b)
}

func benchSigs(path string) {
	data, err := os.ReadFile(path)
	if err != nil {
		panic(err)
	}
	n := int(binary.BigEndian.Uint32(data))
	off := 4
	var entries []sigEntry
	errs := 0
	for i := 0; i < n; i++ {
		e := sigEntry{k256: data[off] == 1}
		off++
		l := int(binary.BigEndian.Uint16(data[off:]))
		e.signed = data[off+2 : off+2+l]
		off += 2 + l
		l = int(binary.BigEndian.Uint16(data[off:]))
		e.pubkey = data[off+2 : off+2+l]
		off += 2 + l
		var c repo.Commit
		if err := c.UnmarshalCBOR(bytes.NewReader(e.signed)); err != nil {
			errs++
			continue
		}
		e.unsigned, err = c.UnsignedBytes()
		e.sig = c.Sig
		if e.key, err = parseKey(e.k256, e.pubkey); err != nil || c.VerifySignature(e.key) != nil {
			errs++
			continue
		}
		entries = append(entries, e)
	}
	work := float64(len(entries))
	check := func(ok int) {
		if ok != len(entries) {
			panic(fmt.Sprintf("verified %d of %d", ok, len(entries)))
		}
	}
	tiers := []struct {
		name string
		f    func()
	}{
		{"full", func() {
			ok := 0
			for _, e := range entries {
				var c repo.Commit
				if c.UnmarshalCBOR(bytes.NewReader(e.signed)) != nil {
					continue
				}
				k, err := parseKey(e.k256, e.pubkey)
				if err == nil && c.VerifySignature(k) == nil {
					ok++
				}
			}
			check(ok)
		}},
		{"crypto", func() {
			ok := 0
			for _, e := range entries {
				k, err := parseKey(e.k256, e.pubkey)
				if err == nil && k.HashAndVerify(e.unsigned, e.sig) == nil {
					ok++
				}
			}
			check(ok)
		}},
		{"preparsed", func() {
			ok := 0
			for _, e := range entries {
				if e.key.HashAndVerify(e.unsigned, e.sig) == nil {
					ok++
				}
			}
			check(ok)
		}},
	}
	for _, t := range tiers {
		med, lo, hi := stats(work, t.f)
		emit(row{"sigs", "indigo", t.name, "verifies/s", med, lo, hi, nil, errs})
	}
}

// verifyRepo loads the repository (CAR blocks hash-checked by go-car, commit and MST decoded), walks
// the MST, rebuilds a tree from the walked keys and compares its root with the commit's data CID.
func verifyRepo(b []byte) error {
	ctx := context.Background()
	commit, r, err := repo.LoadRepoFromCAR(ctx, bytes.NewReader(b))
	if err != nil {
		return err
	}
	m := map[string]cid.Cid{}
	if err := r.MST.Walk(func(k []byte, v cid.Cid) error {
		m[string(k)] = v
		return nil
	}); err != nil {
		return err
	}
	tree, err := mst.LoadTreeFromMap(m)
	if err != nil {
		return err
	}
	root, err := tree.RootCID()
	if err != nil {
		return err
	}
	if !root.Equals(commit.Data) {
		return fmt.Errorf("root mismatch: %s != %s", root, commit.Data)
	}
	return nil
}

func benchRepo(path, label string) {
	b, err := os.ReadFile(path)
	if err != nil {
		panic(err)
	}
	errs := 0
	if err := verifyRepo(b); err != nil {
		fmt.Fprintln(os.Stderr, "indigo repo:", err)
		errs = 1
	}
	med, lo, hi := stats(float64(len(b)*(*repeat))/1e6, func() {
		for i := 0; i < *repeat; i++ {
			verifyRepo(b)
		}
	})
	emit(row{"repo", "indigo", label, "MB/s", med, lo, hi, nil, errs})
}

func main() {
	flag.Parse()
	args := flag.Args()
	if len(args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: indigo-bench [--warmup N --passes N --repeat N] decode FILE LABEL | sigs FILE | repo FILE LABEL")
		os.Exit(2)
	}
	label := ""
	if len(args) > 2 {
		label = args[2]
	}
	switch args[0] {
	case "decode":
		benchDecode(args[1], label)
	case "sigs":
		benchSigs(args[1])
	case "repo":
		benchRepo(args[1], label)
	default:
		fmt.Fprintln(os.Stderr, "unknown benchmark", args[0])
		os.Exit(2)
	}
}
