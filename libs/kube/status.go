package kube

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// StatusOf converts any error into the Kubernetes Status a client receives.
// Errors that are not API errors become 500 InternalError; their text is not
// shown to clients (it may name internal addresses), the caller logs it.
func StatusOf(err error) metav1.Status {
	var api apierrors.APIStatus
	if errors.As(err, &api) {
		s := api.Status()
		s.Kind, s.APIVersion = "Status", "v1"
		if s.Status == "" {
			s.Status = metav1.StatusFailure
		}
		return s
	}
	return metav1.Status{
		TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
		Status:   metav1.StatusFailure,
		Message:  "an internal error occurred",
		Reason:   metav1.StatusReasonInternalError,
		Code:     http.StatusInternalServerError,
	}
}

// WriteStatus writes err as a Kubernetes Status response, with Retry-After
// when the status asks for a retry. It returns the HTTP code written.
func WriteStatus(w http.ResponseWriter, err error) int {
	if errors.Is(err, ErrNoRoute) {
		http.NotFound(w, nil)
		return http.StatusNotFound
	}
	s := StatusOf(err)
	if s.Details != nil && s.Details.RetryAfterSeconds > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int(s.Details.RetryAfterSeconds)))
	}
	b, _ := json.Marshal(s)
	b = append(b, '\n') // kube's JSON serializer ends a document with a newline
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(int(s.Code))
	w.Write(b)
	return int(s.Code)
}

// WriteRawStatus writes err's Status as kube-apiserver writes an error when
// no media type of the request's Accept header is acceptable for it
// (responsewriters.WriteRawJSON): indented JSON, no trailing newline.
func WriteRawStatus(w http.ResponseWriter, err error) int {
	if errors.Is(err, ErrNoRoute) {
		http.NotFound(w, nil)
		return http.StatusNotFound
	}
	s := StatusOf(err)
	b, _ := json.MarshalIndent(s, "", "  ")
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(int(s.Code))
	w.Write(b)
	return int(s.Code)
}

// TooOld is the 410 a watch from a revision older than the server's history
// gets, as kube-apiserver words it.
func TooOld(requested, oldest int64) error {
	return apierrors.NewResourceExpired("too old resource version: " + strconv.FormatInt(requested, 10) + " (" + strconv.FormatInt(oldest, 10) + ")")
}

// ErrorEvent encodes err as a watch ERROR event line.
func ErrorEvent(err error) []byte {
	s := StatusOf(err)
	b, _ := json.Marshal(struct {
		Type   string        `json:"type"`
		Object metav1.Status `json:"object"`
	}{"ERROR", s})
	return append(b, '\n')
}

// ErrNoRoute is a path under a group kube-apiserver has no built-in
// handler for (an unknown group, or a custom resource's group, which
// apiextensions-apiserver serves): kube-apiserver answers it from its last
// handler, with a plain-text "404 page not found" rather than a Status.
// WriteStatus writes it so.
var ErrNoRoute = errors.New("404 page not found")
