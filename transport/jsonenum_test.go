package transport

import (
	"bytes"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
)

// Every command-line name of every enum decodes to the value of the same
// number as its proto name.
func TestDecodeEnumNamesMatchProto(t *testing.T) {
	t.Parallel()
	for _, field := range []string{"algorithm", "mode", "calendar"} {
		f, _ := enumFieldOf(field)
		vals := f.enum.Values()
		for i := range vals.Len() {
			v := vals.Get(i)
			for _, name := range []string{string(v.Name()), strings.ToLower(strings.TrimPrefix(string(v.Name()), strings.ToUpper(field)+"_"))} {
				got, err := f.protoName(name)
				if name == "unspecified" { // the algorithm's 0 has no command-line name
					if err == nil {
						t.Errorf("%s %q accepted", field, name)
					}
					continue
				}
				if err != nil || got != string(v.Name()) {
					t.Errorf("%s %q = %q, %v; want %s", field, name, got, err, v.Name())
				}
			}
		}
	}
}

// FuzzDecodeCheckRequest checks the enum-name decoding against protojson:
// it never panics; a body protojson accepts decodes to the same message; a
// body it accepts decodes to a message that, written back as proto JSON,
// protojson reads as the same message; and a body whose command-line enum
// names are written as proto names decodes alike.
func FuzzDecodeCheckRequest(f *testing.F) {
	for _, seed := range []string{
		`{"requests":[{"name":"a","key":"k","limit":5,"window_ms":1000,"algorithm":"token_bucket"}]}`,
		`{"requests":[{"name":"a","key":"k","algorithm":"ALGORITHM_GCRA","mode":"elastic","calendar":null}]}`,
		`{"requests":[{"name":"a","key":"k","limits":[{"algorithm":"fixed_window","calendar":"month"},{"mode":"soft"}]}]}`,
		`{"requests":[{"algorithm":"tok\u0065n_bucket"}]}`,
		`{"requests":[{"algorithm" : "sliding_log" , "mode":2}]}`,
		`{"requests":[{"algorithm":"magic"}]}`, `{"requests":[{"mode":""}]}`, `{"requests":[{"calendar":[]}]}`,
		`{"requests":[{"x":{"algorithm":"gcra"}}]}`, `{"requests":{"algorithm":"gcra"}}`, `{"algorithm":"gcra"}`,
		`{"requests":[{"algorithm":"gcra"`, `[{"algorithm":"gcra"}]`, `{"requests":[{"algorithm":"gcra","algorithm":"gcra"}]}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var got sluicev1.CheckRequest
		err := decodeCheckRequest(body, &got)
		var plain sluicev1.CheckRequest
		if jsonIn.Unmarshal(body, &plain) == nil {
			if err != nil || !proto.Equal(&got, &plain) {
				t.Fatalf("protojson reads %q as %v, decodeCheckRequest as %v (%v)", body, &plain, &got, err)
			}
			return
		}
		if err != nil {
			if err.Error() == "" {
				t.Fatalf("empty error for %q", body)
			}
			return
		}
		out, merr := jsonOut.Marshal(&got)
		if merr != nil {
			t.Fatalf("%v written back: %v", &got, merr)
		}
		var again sluicev1.CheckRequest
		if err := jsonIn.Unmarshal(out, &again); err != nil || !proto.Equal(&again, &got) {
			t.Fatalf("%q decoded to %v; written back %s reads as %v (%v)", body, &got, out, &again, err)
		}
		fixed, ferr := protoEnumNames(body)
		if ferr != nil || fixed == nil || bytes.Equal(fixed, body) {
			t.Fatalf("%q accepted only after rewriting, but the rewrite is %q, %v", body, fixed, ferr)
		}
	})
}
