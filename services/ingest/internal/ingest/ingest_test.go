package ingest

import "testing"

func TestIsJSONObject(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want bool
	}{
		{`{"kind":"Pod","metadata":{"name":"a"}}`, true},
		{" \n\t{}\n", true},
		{`{"a":1} {"b":2}`, false}, // two values
		{`{"a":1`, false},
		{`null`, false},
		{`[{"a":1}]`, false},
		{`"{}"`, false},
		{``, false},
		{"\x00\x01binary", false},
		{`{"a":1}x`, false},
	} {
		if got := isJSONObject([]byte(tc.in)); got != tc.want {
			t.Errorf("isJSONObject(%q) = %v, want %v", tc.in, got, tc.want)
		}
	}
}
