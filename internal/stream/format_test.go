package stream

import "testing"

func TestFormatOf(t *testing.T) {
	cases := map[string]Format{
		"application/json":                                 JSON,
		"application/json;charset=utf-8":                   JSON,
		"Application/JSON; charset=UTF-8":                  JSON,
		"application/vnd.kubernetes.protobuf;stream=watch": Protobuf,
		"application/vnd.kubernetes.protobuf":              Protobuf,
		"application/cbor-seq":                             CBOR,
		"application/cbor":                                 CBOR,
		"application/json;;bad":                            JSON,
	}
	for ct, want := range cases {
		if got, ok := FormatOf(ct); !ok || got != want {
			t.Errorf("FormatOf(%q) = %v, %v; want %v", ct, got, ok, want)
		}
	}
	for _, ct := range []string{"", "text/html", "application/yaml", "application/vnd.kubernetes.protobuf.x", "application/json-seq"} {
		if f, ok := FormatOf(ct); ok {
			t.Errorf("FormatOf(%q) = %v", ct, f)
		}
	}
	for _, f := range formats {
		if got, ok := FormatOf(f.ContentType()); !ok || got != f {
			t.Errorf("FormatOf(%s.ContentType()) = %v", f, got)
		}
		if f.String() == "unknown" {
			t.Errorf("%d has no name", f)
		}
	}
	if Format(0).String() != "unknown" || Format(0).ContentType() != "" {
		t.Error("zero Format has a name")
	}
}

func TestParseRV(t *testing.T) {
	cases := []struct {
		in string
		n  uint64
		ok bool
	}{
		{"0", 0, true}, {"1", 1, true}, {"123", 123, true},
		{"18446744073709551615", 18446744073709551615, true},
		{"18446744073709551616", 0, false}, {"99999999999999999999", 0, false},
		{"", 0, false}, {"01", 0, false}, {"-1", 0, false}, {"+1", 0, false},
		{"1a", 0, false}, {" 1", 0, false}, {"123456789012345678901", 0, false},
	}
	for _, c := range cases {
		n, ok := ParseRV(c.in)
		if n != c.n || ok != c.ok {
			t.Errorf("ParseRV(%q) = %d, %v; want %d, %v", c.in, n, ok, c.n, c.ok)
		}
	}
}
