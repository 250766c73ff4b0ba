package overrides

// Records as they travel between nodes (a gossip message of one record, a
// state sync of all) and as they are kept on disk: a format byte, then
// JSON with names that never change.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/sluicehq/sluice/bucket"
)

// Format bytes: the first byte of an encoding.
const (
	formatOne = 0x01 // one record: a gossip broadcast
	formatSet = 0x02 // every record: a state sync or the file on disk
)

// MaxSetLen bounds a decoded set's encoding: MaxRecords records of at
// most MaxEncodedLen bytes.
const MaxSetLen = MaxRecords*MaxEncodedLen + 64

type wireLimit struct {
	Algorithm          uint8  `json:"algorithm,omitempty"`
	Limit              int64  `json:"limit"`
	WindowMS           int64  `json:"window_ms"`
	Burst              int64  `json:"burst,omitempty"`
	SubWindows         int64  `json:"sub_windows,omitempty"`
	Shaping            bool   `json:"shaping,omitempty"`
	Mode               uint8  `json:"mode,omitempty"`
	SoftPercent        int64  `json:"soft_percent,omitempty"`
	ElasticCeiling     int64  `json:"elastic_ceiling,omitempty"`
	ElasticLoadPercent int64  `json:"elastic_load_percent,omitempty"`
	CountRefused       bool   `json:"count_refused,omitempty"`
	Global             bool   `json:"global,omitempty"`
	Calendar           uint8  `json:"calendar,omitempty"`
	CalendarTZ         string `json:"calendar_tz,omitempty"`
}

type wireRecord struct {
	Name    string      `json:"name"`
	Key     string      `json:"key"`
	Prefix  bool        `json:"prefix,omitempty"`
	Limits  []wireLimit `json:"limits,omitempty"`
	Deleted bool        `json:"deleted,omitempty"`
	Version uint64      `json:"version"`
	Origin  string      `json:"origin"`
	SetBy   string      `json:"set_by,omitempty"`
	Note    string      `json:"note,omitempty"`
	SetAt   int64       `json:"set_at"`
}

type wireSet struct {
	Records []wireRecord `json:"records"`
}

func toWire(o Override) wireRecord {
	w := wireRecord{Name: o.Name, Key: o.Key, Prefix: o.Prefix, Deleted: o.Deleted, Version: o.Version, Origin: o.Origin,
		SetBy: o.SetBy, Note: o.Note, SetAt: o.SetAt}
	for _, l := range o.Limits {
		w.Limits = append(w.Limits, wireLimit{Algorithm: uint8(l.Algorithm), Limit: l.Limit, WindowMS: l.WindowMS, Burst: l.Burst,
			SubWindows: l.SubWindows, Shaping: l.Shaping, Mode: uint8(l.Mode), SoftPercent: l.SoftPercent, ElasticCeiling: l.ElasticCeiling,
			ElasticLoadPercent: l.ElasticLoadPercent, CountRefused: l.CountRefused, Global: l.Global, Calendar: uint8(l.Calendar), CalendarTZ: l.CalendarTZ})
	}
	return w
}

func fromWire(w wireRecord) Override {
	o := Override{Target: Target{Name: w.Name, Key: w.Key, Prefix: w.Prefix}, Deleted: w.Deleted, Version: w.Version, Origin: w.Origin,
		SetBy: w.SetBy, Note: w.Note, SetAt: w.SetAt}
	for _, l := range w.Limits {
		o.Limits = append(o.Limits, bucket.Limit{Algorithm: bucket.Algorithm(l.Algorithm), Limit: l.Limit, WindowMS: l.WindowMS, Burst: l.Burst,
			SubWindows: l.SubWindows, Shaping: l.Shaping, Mode: bucket.Mode(l.Mode), SoftPercent: l.SoftPercent, ElasticCeiling: l.ElasticCeiling,
			ElasticLoadPercent: l.ElasticLoadPercent, CountRefused: l.CountRefused, Global: l.Global, Calendar: bucket.Calendar(l.Calendar), CalendarTZ: l.CalendarTZ})
	}
	return o
}

// encodeOne encodes one record without validating it.
func encodeOne(o Override) []byte {
	b, _ := json.Marshal(toWire(o)) // plain fields: never fails
	return append([]byte{formatOne}, b...)
}

// EncodeOne encodes one record for a gossip message.
func EncodeOne(o Override) []byte { return encodeOne(o) }

// EncodeSet encodes records for a state sync or the file on disk.
func EncodeSet(recs []Override) []byte {
	ws := wireSet{Records: make([]wireRecord, 0, len(recs))}
	for _, o := range recs {
		ws.Records = append(ws.Records, toWire(o))
	}
	b, _ := json.Marshal(ws)
	return append([]byte{formatSet}, b...)
}

// decodeJSON decodes b into v, refusing unknown fields and anything after
// the value.
func decodeJSON(b []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	if err := d.Decode(v); err != nil {
		return err
	}
	if d.More() {
		return fmt.Errorf("data after the value")
	}
	return nil
}

// Decode decodes a gossip message or a set: every record, each of which
// validates; any error refuses the whole input and names where it is.
func Decode(b []byte) ([]Override, error) {
	if len(b) == 0 {
		return nil, fmt.Errorf("overrides: empty input")
	}
	switch b[0] {
	case formatOne:
		if len(b) > MaxEncodedLen {
			return nil, fmt.Errorf("overrides: a record of %d bytes, more than %d", len(b), MaxEncodedLen)
		}
		var w wireRecord
		if err := decodeJSON(b[1:], &w); err != nil {
			return nil, fmt.Errorf("overrides: record: %w", err)
		}
		o := fromWire(w)
		if err := o.Validate(); err != nil {
			return nil, fmt.Errorf("overrides: record of %v: %w", o.Target, err)
		}
		return []Override{o}, nil
	case formatSet:
		if len(b) > MaxSetLen {
			return nil, fmt.Errorf("overrides: a set of %d bytes, more than %d", len(b), MaxSetLen)
		}
		var ws wireSet
		if err := decodeJSON(b[1:], &ws); err != nil {
			return nil, fmt.Errorf("overrides: set: %w", err)
		}
		if len(ws.Records) > MaxRecords {
			return nil, fmt.Errorf("overrides: a set of %d records, more than %d", len(ws.Records), MaxRecords)
		}
		out := make([]Override, 0, len(ws.Records))
		seen := make(map[Target]bool, len(ws.Records))
		for i, w := range ws.Records {
			o := fromWire(w)
			if err := o.Validate(); err != nil {
				return nil, fmt.Errorf("overrides: records[%d] (%v): %w", i, o.Target, err)
			}
			if seen[o.Target] {
				return nil, fmt.Errorf("overrides: records[%d]: a second record of %v", i, o.Target)
			}
			seen[o.Target] = true
			out = append(out, o)
		}
		return out, nil
	}
	return nil, fmt.Errorf("overrides: format byte %#x, want 1 or 2", b[0])
}

// WriteFile writes recs to path atomically: a temporary file beside it,
// synced, then renamed over it, and the directory synced.
func WriteFile(path string, recs []Override) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(EncodeSet(recs)); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	if d, err := os.Open(filepath.Dir(path)); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}

// ReadFile reads the records WriteFile wrote to path; a missing file is
// no records.
func ReadFile(path string) ([]Override, error) {
	b, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	recs, err := Decode(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return recs, nil
}
