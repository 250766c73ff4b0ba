package transport

// The JSON body of POST /v1/check: protojson, with the enum fields also
// taking the names the command line and rules files use (bucket's
// ParseAlgorithm, ParseMode and ParseCalendar: one table of names).

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/sluicehq/sluice/bucket"
	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
)

// decodeCheckRequest parses a CheckRequest in JSON (proto or lowerCamel
// field names, unknown fields refused). The enum fields algorithm, mode
// and calendar, in a request and in each of its limits, take a proto name
// (ALGORITHM_TOKEN_BUCKET), a number, or the lower-case name of the
// command line (token_bucket, soft, day). The error says what is wrong
// and where: the field's path for an enum value, protojson's line and
// column otherwise.
//
// A body protojson accepts as it is is parsed once; only a body it
// refuses is scanned for lower-case names, which are rewritten to their
// proto names before a second parse.
func decodeCheckRequest(body []byte, req *sluicev1.CheckRequest) error {
	err := jsonIn.Unmarshal(body, req)
	if err == nil {
		return nil
	}
	fixed, ferr := protoEnumNames(body)
	if ferr != nil {
		return ferr
	}
	if fixed == nil {
		return malformedJSON(err)
	}
	proto.Reset(req)
	if err := jsonIn.Unmarshal(fixed, req); err != nil {
		return malformedJSON(err)
	}
	return nil
}

// malformedJSON words protojson's error for a client: without its
// "proto:" prefix (whose space protojson varies on purpose, so that no
// program depends on its text), with the place first.
func malformedJSON(err error) error {
	msg := strings.TrimPrefix(err.Error(), "proto:")
	msg = strings.TrimLeft(msg, " \u00a0")
	if rest, ok := strings.CutPrefix(msg, "("); ok {
		if at, after, ok := strings.Cut(rest, "): "); ok && strings.HasPrefix(at, "line ") {
			return fmt.Errorf("malformed CheckRequest JSON at %s: %s", at, after)
		}
	}
	return fmt.Errorf("malformed CheckRequest JSON: %s", msg)
}

// enumField is one enum field of RateLimitRequest or Limit: how its
// command-line names parse, and the proto enum they name.
type enumField struct {
	parse func(string) (int, error)
	enum  protoreflect.EnumDescriptor
}

// enumFields are the enum fields a request and a limit share (their JSON
// names are the same in proto and lowerCamel form).
func enumFieldOf(key string) (enumField, bool) {
	switch key {
	case "algorithm":
		return enumField{func(s string) (int, error) { a, err := bucket.ParseAlgorithm(s); return int(a), err },
			sluicev1.Algorithm(0).Descriptor()}, true
	case "mode":
		return enumField{func(s string) (int, error) {
			if s == "" { // ParseMode takes "" for hard; JSON does not
				return 0, errors.New(`unknown mode "" (want hard, soft or elastic)`)
			}
			m, err := bucket.ParseMode(s)
			return int(m), err
		}, sluicev1.Mode(0).Descriptor()}, true
	case "calendar":
		return enumField{func(s string) (int, error) {
			if s == "" {
				return 0, errors.New(`unknown calendar "" (want none, day, week or month)`)
			}
			c, err := bucket.ParseCalendar(s)
			return int(c), err
		}, sluicev1.Calendar(0).Descriptor()}, true
	}
	return enumField{}, false
}

// protoName returns the proto name of the value named s: s itself when it
// is one, the proto name of the command-line name s, or an error that lists
// the valid names and numbers.
func (f enumField) protoName(s string) (string, error) {
	vals := f.enum.Values()
	if vals.ByName(protoreflect.Name(s)) != nil {
		return s, nil
	}
	n, err := f.parse(s)
	if err != nil {
		names := make([]string, vals.Len())
		for i := range names {
			names[i] = string(vals.Get(i).Name())
		}
		return "", fmt.Errorf("%v; or a proto name (%s) or its number (%d..%d)", err,
			strings.Join(names, ", "), vals.Get(0).Number(), vals.Get(vals.Len()-1).Number())
	}
	v := vals.ByNumber(protoreflect.EnumNumber(n))
	if v == nil { // a name bucket knows and the proto does not: cannot happen
		return "", fmt.Errorf("%q has no proto value", s)
	}
	return string(v.Name()), nil
}

// enumEdit replaces body[start:end] (a JSON string) with a proto name.
type enumEdit struct {
	start, end int
	name       string
}

// enumScan walks a CheckRequest's JSON tokens and collects the edits that
// turn command-line enum names into proto names.
type enumScan struct {
	dec   *json.Decoder
	body  []byte
	edits []enumEdit
}

// errNotJSON stops a scan at JSON that protojson will refuse anyway.
var errNotJSON = errors.New("not JSON")

// protoEnumNames returns body with the command-line names of its enum
// fields replaced by proto names; nil when there is nothing to replace or
// body is not JSON of objects and arrays where a CheckRequest has them
// (protojson's error then says what is wrong). An enum field with a value
// that is no name, number or null is an error naming the field.
func protoEnumNames(body []byte) ([]byte, error) {
	s := enumScan{dec: json.NewDecoder(bytes.NewReader(body)), body: body}
	s.dec.UseNumber()
	if err := s.value("", levelRoot); err != nil {
		if errors.Is(err, errNotJSON) {
			return nil, nil
		}
		return nil, err
	}
	if len(s.edits) == 0 {
		return nil, nil
	}
	out := make([]byte, 0, len(body)+16*len(s.edits))
	last := 0
	for _, e := range s.edits {
		out = append(out, body[last:e.start]...)
		out = strconv.AppendQuote(out, e.name)
		last = e.end
	}
	return append(out, body[last:]...), nil
}

// The levels of a CheckRequest: what the object or array at hand is.
type level uint8

const (
	levelOther    level = iota // anything else: skipped
	levelRoot                  // the CheckRequest object
	levelRequests              // its requests array
	levelRequest               // one RateLimitRequest object
	levelLimits                // a request's limits array
	levelLimit                 // one Limit object
)

// value reads one JSON value at path, of the given level.
func (s *enumScan) value(path string, lv level) error {
	tok, err := s.dec.Token()
	if err != nil {
		return errNotJSON
	}
	d, ok := tok.(json.Delim)
	if !ok {
		return nil // a scalar: nothing to do here
	}
	switch d {
	case '{':
		return s.object(path, lv)
	case '[':
		elem := levelOther
		switch lv {
		case levelRequests:
			elem = levelRequest
		case levelLimits:
			elem = levelLimit
		}
		for i := 0; s.dec.More(); i++ {
			if err := s.value(path+"["+strconv.Itoa(i)+"]", elem); err != nil {
				return err
			}
		}
		if _, err := s.dec.Token(); err != nil {
			return errNotJSON
		}
		return nil
	}
	return errNotJSON
}

func (s *enumScan) object(path string, lv level) error {
	for s.dec.More() {
		tok, err := s.dec.Token()
		if err != nil {
			return errNotJSON
		}
		key, ok := tok.(string)
		if !ok {
			return errNotJSON
		}
		at := key
		if path != "" {
			at = path + "." + key
		}
		next := levelOther
		switch {
		case lv == levelRoot && key == "requests":
			next = levelRequests
		case lv == levelRequest && key == "limits":
			next = levelLimits
		case lv == levelRequest || lv == levelLimit:
			if f, ok := enumFieldOf(key); ok {
				if err := s.enum(at, f); err != nil {
					return err
				}
				continue
			}
		}
		if err := s.value(at, next); err != nil {
			return err
		}
	}
	if _, err := s.dec.Token(); err != nil {
		return errNotJSON
	}
	return nil
}

// enum reads the value of enum field f at path and notes an edit when it
// is a command-line name.
func (s *enumScan) enum(path string, f enumField) error {
	before := int(s.dec.InputOffset()) // after the key; then ':' and the value
	tok, err := s.dec.Token()
	if err != nil {
		return errNotJSON
	}
	switch v := tok.(type) {
	case nil, json.Number:
		return nil // null is the zero value; protojson checks numbers
	case string:
		name, err := f.protoName(v)
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		if name != v {
			end := int(s.dec.InputOffset())
			start := before + bytes.IndexByte(s.body[before:end], '"')
			s.edits = append(s.edits, enumEdit{start: start, end: end, name: name})
		}
		return nil
	case json.Delim:
		what := "an array"
		if v == '{' {
			what = "an object"
		}
		return fmt.Errorf("%s: want a name or a number, not %s", path, what)
	default:
		return fmt.Errorf("%s: want a name or a number, not %v", path, v)
	}
}
