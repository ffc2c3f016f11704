package stream

import (
	"testing"

	"google.golang.org/protobuf/proto"

	heraldv1 "herald.dev/libs/proto/herald/v1"
)

// Consume reads its subjects in order from a sequence on, and Stop removes
// its consumer from the server: readers that come and go (a deep replay per
// resuming watch) leave nothing behind.
func TestConsumeDeletesItsConsumer(t *testing.T) {
	st, pub := testStream(t)
	ctx := t.Context()
	var recs []*heraldv1.Record
	for i := range 10 {
		rec := part(int64(100+i), 0, 1)
		recs = append(recs, rec)
		appendRecord(t, pub, rec)
		pub(SubjectOther, []byte("not read")) // another subject: filtered out
	}
	for range 50 {
		m, err := Consume(ctx, st, []string{SubjectMulti}, 5)
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range recs[2:5] { // sequences 5, 7, 9
			msg, err := m.Next()
			if err != nil {
				t.Fatal(err)
			}
			got, err := Decode(msg.Data())
			if err != nil || !proto.Equal(got, want) {
				t.Fatalf("read %v, %v; want %v", got, err, want)
			}
		}
		m.Stop()
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n := info.State.Consumers; n != 0 {
		t.Errorf("%d consumers left on the server after 50 readers stopped", n)
	}
}
