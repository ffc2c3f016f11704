package frontdoor

import "net/http"

// writeStatus writes err as the answer to r, in the media type the client
// asked for (reads.Reads.WriteStatus).
func (s *Server) writeStatus(w http.ResponseWriter, r *http.Request, err error) {
	s.reads.WriteStatus(w, r, err)
}
