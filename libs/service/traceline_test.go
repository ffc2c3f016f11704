package service

import "testing"

func TestTraceLine(t *testing.T) {
	const tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	line := TraceLine(tp)
	if string(line) != "#herald:traceparent="+tp+"\n" {
		t.Fatalf("TraceLine = %q", line)
	}
	if got, ok := ParseTraceLine(string(line[:len(line)-1])); !ok || got != tp {
		t.Fatalf("ParseTraceLine = %q, %v", got, ok)
	}
	for _, other := range []string{"#unknown", `{"type":"ADDED"}`, "herald:traceparent=" + tp} {
		if _, ok := ParseTraceLine(other); ok {
			t.Errorf("ParseTraceLine(%q) accepted", other)
		}
	}
}
