// indigo-check: Bluesky's own Go library (bluesky-social/indigo) as an independent oracle for
// riptide's generated streams and for riptide's verifier (see oracles/README.md).
//
// It verifies with indigo's library functions only, never with riptide's code:
//
//	frames FRAMES --did-docs DOCS.json [--json]
//	    each frame of a corpus file (shared/docs/formats.md): header and payload decoded with
//	    indigo's cbor-gen types; #commit: repo.VerifyCommitMessage (CAR loaded with every block's
//	    hash checked, ops' record CIDs checked against the MST, ops inverted on the partial MST,
//	    root compared with prevData) AND repo.VerifyCommitSignature with the account's key from an
//	    identity.MockDirectory built from DOCS; #sync: repo.VerifySyncMessage; #identity, #account,
//	    #info: decoded; any other message type is skipped, as indigo's events consumer does.
//	lows FRAMES --did-docs DOCS.json
//	    whether indigo enforces low-S: each commit's signature is malleated to its high-S twin
//	    (s -> n - s, equally valid ECDSA); counts of twins rejected by the strict verification
//	    and accepted by indigo's lenient one (proving the twin is a real signature).
//	repo CAR --did-doc DOC.json
//	    repo.LoadRepoFromCAR, the commit's signature with the document's key, the MST walked
//	    (record count), a tree rebuilt from the walked entries and its root compared with `data`.
//
// Besides the library verdict, `frames` reports `relay_error`: what the extra checks of indigo's
// relay (cmd/relay/relay/verify.go: size and op limits, event/commit field agreement, deprecated
// flags) say. They are methods of the relay's service type, which cannot be used without its
// database stack, so they are restated here with the relay's constants and messages.
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
	"log/slog"
	"math/big"
	"os"

	comatproto "github.com/bluesky-social/indigo/api/atproto"
	"github.com/bluesky-social/indigo/atproto/atcrypto"
	"github.com/bluesky-social/indigo/atproto/identity"
	"github.com/bluesky-social/indigo/atproto/repo"
	"github.com/bluesky-social/indigo/atproto/repo/mst"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/bluesky-social/indigo/events"
	cid "github.com/ipfs/go-cid"
)

// The relay's limits, copied from cmd/relay/relay/verify.go at the pinned indigo version.
const relayMaxMessageBlocksBytes = 2_000_000
const relayMaxCommitOps = 200

type frameResult struct {
	Index      int     `json:"index"`
	Seq        *int64  `json:"seq"`
	DID        *string `json:"did"`
	Kind       string  `json:"kind"`
	Accepted   bool    `json:"accepted"`
	Error      *string `json:"error"`
	RelayError *string `json:"relay_error"`
	// InversionChecked: VerifyCommitMessage compared the inverted MST with prevData. It skips
	// that comparison, and still accepts, when prevData is absent or an update/delete lacks
	// `prev` (legacy frames); this makes such an acceptance visible.
	InversionChecked bool `json:"inversion_checked"`
}

func errString(err error) *string {
	if err == nil {
		return nil
	}
	s := err.Error()
	return &s
}

// splitFrames reads the corpus format: u32 count, then u32 length + bytes per frame (big-endian).
func splitFrames(data []byte) ([][]byte, error) {
	if len(data) < 4 {
		return nil, errors.New("corpus shorter than its frame count")
	}
	n := binary.BigEndian.Uint32(data)
	off := 4
	var frames [][]byte
	for i := uint32(0); i < n; i++ {
		if len(data)-off < 4 {
			return nil, fmt.Errorf("frame %d: length prefix past the end", i)
		}
		l := int(binary.BigEndian.Uint32(data[off:]))
		off += 4
		if len(data)-off < l {
			return nil, fmt.Errorf("frame %d: %d bytes declared, %d remain", i, l, len(data)-off)
		}
		frames = append(frames, data[off:off+l])
		off += l
	}
	if off != len(data) {
		return nil, fmt.Errorf("%d trailing bytes after %d frames", len(data)-off, n)
	}
	return frames, nil
}

// loadDirectory builds indigo's in-memory identity directory from DID documents, each parsed by
// identity.ParseIdentity exactly as indigo's resolvers parse a fetched document.
func loadDirectory(docs map[string]json.RawMessage) (*identity.MockDirectory, error) {
	dir := identity.NewMockDirectory()
	for did, raw := range docs {
		var doc identity.DIDDocument
		if err := json.Unmarshal(raw, &doc); err != nil {
			return nil, fmt.Errorf("document of %s: %w", did, err)
		}
		if doc.DID.String() != did {
			return nil, fmt.Errorf("document under %s has id %s", did, doc.DID)
		}
		dir.Insert(identity.ParseIdentity(&doc))
	}
	return dir, nil
}

// inversionChecked restates VerifyCommitMessage's early exits (atproto/repo/sync.go): it inverts
// and compares only when prevData is set and every update and delete carries `prev`.
func inversionChecked(evt *comatproto.SyncSubscribeRepos_Commit) bool {
	if evt.PrevData == nil {
		return false
	}
	for _, o := range evt.Ops {
		if (o.Action == "update" || o.Action == "delete") && o.Prev == nil {
			return false
		}
	}
	return true
}

func relayCommitChecks(evt *comatproto.SyncSubscribeRepos_Commit) error {
	if len(evt.Blocks) > relayMaxMessageBlocksBytes {
		return fmt.Errorf("blocks size (%d bytes) exceeds protocol limit", len(evt.Blocks))
	}
	if len(evt.Ops) > relayMaxCommitOps {
		return fmt.Errorf("too many ops in commit: %d", len(evt.Ops))
	}
	commit, _, err := repo.LoadCommitFromCAR(context.Background(), bytes.NewReader(evt.Blocks))
	if err != nil {
		return err
	}
	if evt.Repo != commit.DID {
		return fmt.Errorf("mismatched inner commit DID field: %s", commit.DID)
	}
	if evt.Rev != commit.Rev {
		return fmt.Errorf("mismatched inner commit rev field: %s", commit.Rev)
	}
	if evt.TooBig {
		return errors.New("deprecated tooBig commit flag set")
	}
	if evt.Rebase {
		return errors.New("deprecated rebase commit flag set")
	}
	return nil
}

func relaySyncChecks(evt *comatproto.SyncSubscribeRepos_Sync) error {
	if len(evt.Blocks) > relayMaxMessageBlocksBytes {
		return fmt.Errorf("blocks size (%d bytes) exceeds protocol limit", len(evt.Blocks))
	}
	commit, _, err := repo.LoadCommitFromCAR(context.Background(), bytes.NewReader(evt.Blocks))
	if err != nil {
		return err
	}
	if evt.Did != commit.DID {
		return fmt.Errorf("mismatched inner commit DID field: %s", commit.DID)
	}
	if evt.Rev != commit.Rev {
		return fmt.Errorf("mismatched inner commit rev field: %s", commit.Rev)
	}
	return nil
}

// checkFrame decodes and verifies one frame; a panic inside indigo (hostile input) is a rejection.
func checkFrame(ctx context.Context, dir identity.Directory, index int, f []byte) (res frameResult) {
	res.Index = index
	defer func() {
		if p := recover(); p != nil {
			res.Accepted = false
			res.Error = errString(fmt.Errorf("panic in indigo: %v", p))
		}
	}()
	r := bytes.NewReader(f)
	var hdr events.EventHeader
	if err := hdr.UnmarshalCBOR(r); err != nil {
		res.Kind = "?"
		res.Error = errString(fmt.Errorf("reading header: %w", err))
		return
	}
	res.Kind = hdr.MsgType
	if hdr.Op != events.EvtKindMessage {
		res.Kind = fmt.Sprintf("op:%d", hdr.Op)
		var ef events.ErrorFrame
		if hdr.Op == events.EvtKindErrorFrame {
			if err := ef.UnmarshalCBOR(r); err != nil {
				res.Error = errString(err)
				return
			}
			res.Error = errString(fmt.Errorf("error frame: %s: %s", ef.Error, ef.Message))
			return
		}
		res.Error = errString(fmt.Errorf("unrecognized event stream type: %d", hdr.Op))
		return
	}
	var err error
	switch hdr.MsgType {
	case "#commit":
		var evt comatproto.SyncSubscribeRepos_Commit
		if err = evt.UnmarshalCBOR(r); err != nil {
			err = fmt.Errorf("reading repoCommit event: %w", err)
			break
		}
		res.Seq, res.DID = &evt.Seq, &evt.Repo
		res.InversionChecked = inversionChecked(&evt)
		if _, err = repo.VerifyCommitMessage(ctx, &evt); err != nil {
			err = fmt.Errorf("VerifyCommitMessage: %w", err)
		} else if err = repo.VerifyCommitSignature(ctx, dir, &evt); err != nil {
			err = fmt.Errorf("VerifyCommitSignature: %w", err)
		}
		res.RelayError = errString(relayCommitChecks(&evt))
	case "#sync":
		var evt comatproto.SyncSubscribeRepos_Sync
		if err = evt.UnmarshalCBOR(r); err != nil {
			err = fmt.Errorf("reading repoSync event: %w", err)
			break
		}
		res.Seq, res.DID = &evt.Seq, &evt.Did
		if _, err = repo.VerifySyncMessage(ctx, dir, &evt); err != nil {
			err = fmt.Errorf("VerifySyncMessage: %w", err)
		}
		res.RelayError = errString(relaySyncChecks(&evt))
	case "#identity":
		var evt comatproto.SyncSubscribeRepos_Identity
		if err = evt.UnmarshalCBOR(r); err == nil {
			res.Seq, res.DID = &evt.Seq, &evt.Did
		}
	case "#account":
		var evt comatproto.SyncSubscribeRepos_Account
		if err = evt.UnmarshalCBOR(r); err == nil {
			res.Seq, res.DID = &evt.Seq, &evt.Did
		}
	case "#info":
		var evt comatproto.SyncSubscribeRepos_Info
		err = evt.UnmarshalCBOR(r)
	default:
		// indigo's events consumer (events/consumer.go) ignores message types it does not know.
	}
	res.Accepted = err == nil
	res.Error = errString(err)
	return
}

// loadFramesAndDocs reads a corpus file and a DID -> DID document JSON file, as `frames` and
// `lows` both take them; on failure it says why on stderr and returns ok = false (exit code 2).
func loadFramesAndDocs(framesPath, docsPath string) (frames [][]byte, dir *identity.MockDirectory, ok bool) {
	data, err := os.ReadFile(framesPath)
	if err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		return nil, nil, false
	}
	frames, err = splitFrames(data)
	if err != nil {
		fmt.Fprintln(os.Stderr, "error: corpus:", err)
		return nil, nil, false
	}
	rawDocs, err := os.ReadFile(docsPath)
	if err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		return nil, nil, false
	}
	var docs map[string]json.RawMessage
	if err := json.Unmarshal(rawDocs, &docs); err != nil {
		fmt.Fprintln(os.Stderr, "error: did docs:", err)
		return nil, nil, false
	}
	dir, err = loadDirectory(docs)
	if err != nil {
		fmt.Fprintln(os.Stderr, "error: did docs:", err)
		return nil, nil, false
	}
	return frames, dir, true
}

func cmdFrames(args []string) int {
	fs := flag.NewFlagSet("frames", flag.ExitOnError)
	docsPath := fs.String("did-docs", "", "DID -> DID document JSON")
	asJSON := fs.Bool("json", false, "one JSON object per frame on stdout")
	fs.Parse(reorder(args))
	if fs.NArg() != 1 || *docsPath == "" {
		fmt.Fprintln(os.Stderr, "usage: indigo-check frames FRAMES --did-docs DOCS.json [--json]")
		return 2
	}
	frames, dir, ok := loadFramesAndDocs(fs.Arg(0), *docsPath)
	if !ok {
		return 2
	}
	ctx := context.Background()
	out := json.NewEncoder(os.Stdout)
	counts := map[string][2]int{}
	rejected := 0
	for i, f := range frames {
		res := checkFrame(ctx, dir, i, f)
		c := counts[res.Kind]
		if res.Accepted {
			c[0]++
		} else {
			c[1]++
			rejected++
		}
		counts[res.Kind] = c
		if *asJSON {
			out.Encode(res)
		} else if !res.Accepted {
			fmt.Printf("frame %d (%s): rejected: %s\n", i, res.Kind, *res.Error)
		}
	}
	for k, c := range counts {
		fmt.Fprintf(os.Stderr, "%-12s accepted %d rejected %d\n", k, c[0], c[1])
	}
	fmt.Fprintf(os.Stderr, "frames %d accepted %d rejected %d\n", len(frames), len(frames)-rejected, rejected)
	if rejected > 0 {
		return 1
	}
	return 0
}

// Curve orders, for the high-S twin of a signature.
var (
	orderK256, _ = new(big.Int).SetString("FFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141", 16)
	orderP256, _ = new(big.Int).SetString("FFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551", 16)
)

type lowsResult struct {
	Commits       int `json:"commits"`
	K256          int `json:"k256"`
	P256          int `json:"p256"`
	StrictOK      int `json:"strict_ok"`
	TwinRejected  int `json:"twin_rejected"`
	TwinLenientOK int `json:"twin_lenient_ok"`
}

func cmdLows(args []string) int {
	fs := flag.NewFlagSet("lows", flag.ExitOnError)
	docsPath := fs.String("did-docs", "", "DID -> DID document JSON")
	fs.Parse(reorder(args))
	if fs.NArg() != 1 || *docsPath == "" {
		fmt.Fprintln(os.Stderr, "usage: indigo-check lows FRAMES --did-docs DOCS.json")
		return 2
	}
	frames, dir, ok := loadFramesAndDocs(fs.Arg(0), *docsPath)
	if !ok {
		return 2
	}
	ctx := context.Background()
	var res lowsResult
	for _, f := range frames {
		r := bytes.NewReader(f)
		var hdr events.EventHeader
		if hdr.UnmarshalCBOR(r) != nil || hdr.Op != events.EvtKindMessage || hdr.MsgType != "#commit" {
			continue
		}
		var evt comatproto.SyncSubscribeRepos_Commit
		if evt.UnmarshalCBOR(r) != nil {
			continue
		}
		commit, _, err := repo.LoadCommitFromCAR(ctx, bytes.NewReader(evt.Blocks))
		if err != nil || len(commit.Sig) != 64 {
			continue
		}
		ident, err := dir.LookupDID(ctx, syntax.DID(commit.DID))
		if err != nil {
			continue
		}
		key, err := ident.PublicKey()
		if err != nil {
			continue
		}
		order := orderK256
		switch key.(type) {
		case *atcrypto.PublicKeyK256:
			res.K256++
		case *atcrypto.PublicKeyP256:
			order = orderP256
			res.P256++
		default:
			continue
		}
		res.Commits++
		unsigned, err := commit.UnsignedBytes()
		if err != nil {
			continue
		}
		if key.HashAndVerify(unsigned, commit.Sig) == nil {
			res.StrictOK++
		}
		s := new(big.Int).SetBytes(commit.Sig[32:])
		twin := make([]byte, 64)
		copy(twin, commit.Sig[:32])
		new(big.Int).Sub(order, s).FillBytes(twin[32:])
		if key.HashAndVerify(unsigned, twin) != nil {
			res.TwinRejected++
		}
		if key.HashAndVerifyLenient(unsigned, twin) == nil {
			res.TwinLenientOK++
		}
	}
	b, _ := json.Marshal(res)
	fmt.Println(string(b))
	return 0
}

type repoResult struct {
	Records  int     `json:"records"`
	Accepted bool    `json:"accepted"`
	Error    *string `json:"error"`
}

func verifyRepo(path, docPath string) (int, error) {
	ctx := context.Background()
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	rawDoc, err := os.ReadFile(docPath)
	if err != nil {
		return 0, err
	}
	var doc identity.DIDDocument
	if err := json.Unmarshal(rawDoc, &doc); err != nil {
		return 0, fmt.Errorf("did doc: %w", err)
	}
	ident := identity.ParseIdentity(&doc)
	commit, r, err := repo.LoadRepoFromCAR(ctx, bytes.NewReader(b))
	if err != nil {
		return 0, fmt.Errorf("LoadRepoFromCAR: %w", err)
	}
	if commit.DID != doc.DID.String() {
		return 0, fmt.Errorf("commit DID %s, document %s", commit.DID, doc.DID)
	}
	key, err := ident.PublicKey()
	if err != nil {
		return 0, fmt.Errorf("document key: %w", err)
	}
	if err := commit.VerifySignature(key); err != nil {
		return 0, fmt.Errorf("VerifySignature: %w", err)
	}
	m := map[string]cid.Cid{}
	if err := r.MST.Walk(func(k []byte, v cid.Cid) error {
		if _, _, err := syntax.ParseRepoPath(string(k)); err != nil {
			return fmt.Errorf("MST key %q: %w", k, err)
		}
		m[string(k)] = v
		return nil
	}); err != nil {
		return len(m), fmt.Errorf("MST walk: %w", err)
	}
	tree, err := mst.LoadTreeFromMap(m)
	if err != nil {
		return len(m), err
	}
	root, err := tree.RootCID()
	if err != nil {
		return len(m), err
	}
	if !root.Equals(commit.Data) {
		return len(m), fmt.Errorf("rebuilt MST root %s != commit data %s", root, commit.Data)
	}
	return len(m), nil
}

func cmdRepo(args []string) int {
	fs := flag.NewFlagSet("repo", flag.ExitOnError)
	docPath := fs.String("did-doc", "", "the account's DID document (one JSON object)")
	fs.Parse(reorder(args))
	if fs.NArg() != 1 || *docPath == "" {
		fmt.Fprintln(os.Stderr, "usage: indigo-check repo CAR --did-doc DOC.json")
		return 2
	}
	n, err := verifyRepo(fs.Arg(0), *docPath)
	res := repoResult{Records: n, Accepted: err == nil, Error: errString(err)}
	b, _ := json.Marshal(res)
	fmt.Println(string(b))
	if err != nil {
		return 1
	}
	return 0
}

// reorder moves flags before positional arguments (Go's flag package stops at the first
// positional one; the documented usage puts the file first).
func reorder(args []string) []string {
	var flags, pos []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if len(a) > 1 && a[0] == '-' {
			flags = append(flags, a)
			if (a == "--did-docs" || a == "-did-docs" || a == "--did-doc" || a == "-did-doc") && i+1 < len(args) {
				flags = append(flags, args[i+1])
				i++
			}
			continue
		}
		pos = append(pos, a)
	}
	return append(flags, pos...)
}

func main() {
	// indigo logs through slog's default logger (e.g. "prevData was null"); keep stdout/stderr ours.
	slog.SetDefault(slog.New(slog.NewTextHandler(io.Discard, nil)))
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: indigo-check frames FRAMES --did-docs DOCS.json [--json] | lows FRAMES --did-docs DOCS.json | repo CAR --did-doc DOC.json")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "frames":
		os.Exit(cmdFrames(os.Args[2:]))
	case "lows":
		os.Exit(cmdLows(os.Args[2:]))
	case "repo":
		os.Exit(cmdRepo(os.Args[2:]))
	default:
		fmt.Fprintln(os.Stderr, "unknown command", os.Args[1])
		os.Exit(2)
	}
}
