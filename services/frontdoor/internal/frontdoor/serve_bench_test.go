package frontdoor

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

// BenchmarkServeList: one authenticated, authorized LIST served in process
// from the (fake) cache: the cost of frontdoor's own steps per request.
func BenchmarkServeList(b *testing.B) {
	s, _ := testServer(b, "", nil)
	b.ReportAllocs()
	for b.Loop() {
		req := httptest.NewRequest(http.MethodGet, "/api/v1/namespaces/ns1/pods?limit=10", nil)
		req.Header.Set("Authorization", "Bearer "+tokReader)
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, req)
		if rec.Code != http.StatusOK {
			b.Fatalf("%d %s", rec.Code, rec.Body)
		}
	}
}
