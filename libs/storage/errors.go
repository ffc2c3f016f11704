package storage

import (
	"errors"
	"strconv"

	"k8s.io/apimachinery/pkg/runtime/schema"
)

// The kinds of failure of reading a stored value. A *DecodeError wraps
// exactly one of them; test with errors.Is.
var (
	// ErrUnknownKind: the value's apiVersion/kind is not a kind this
	// package knows (protobuf of a type missing from the scheme).
	ErrUnknownKind = errors.New("unknown kind")
	// ErrWrongKind: the value decodes, but as another kind than the
	// resource stores (a Secret under /registry/pods/...).
	ErrWrongKind = errors.New("kind does not match the resource")
	// ErrCorrupt: truncated or corrupt protobuf envelope, invalid JSON, or
	// bytes that are neither.
	ErrCorrupt = errors.New("corrupt value")
	// ErrNotObject: valid JSON that is not an object.
	ErrNotObject = errors.New("JSON value is not an object")
	// ErrDecrypt: the value is encrypted with a supported provider but no
	// configured key decrypts it (wrong key, tampered ciphertext, a value
	// moved to another key, or no encryption configured for the resource).
	ErrDecrypt = errors.New("decryption failed")
	// ErrUnsupportedProvider: the value is encrypted by a provider Herald
	// cannot use (KMS v1/v2, or a provider name it does not know).
	ErrUnsupportedProvider = errors.New("unsupported encryption provider")
	// ErrUnknownKey: an etcd key outside every known layout.
	ErrUnknownKey = errors.New("key outside every known layout")
	// ErrNoProtobuf: the object has no protobuf encoding (custom
	// resources); kube-apiserver answers 406 for it.
	ErrNoProtobuf = errors.New("no protobuf encoding for this object")
)

// DecodeError is a value that could not be read. Its message names the
// resource, key, revision and failure kind, which is what the one log line
// about a skipped value needs.
type DecodeError struct {
	Resource schema.GroupResource
	Key      string
	Revision int64
	// Kind is one of the sentinel errors above.
	Kind error
	// Encrypted is true when the value was stored encrypted.
	Encrypted bool
	// redact leaves the cause's text out of Error: set when the failure
	// came after decryption, where a decoder's message could quote
	// plaintext. Decryption failures themselves keep their cause (the
	// provider and the transformer's message, never data).
	redact bool
	cause  error
}

func (e *DecodeError) Error() string {
	msg := e.Resource.String() + " " + strconv.Quote(e.Key) + " at revision " + strconv.FormatInt(e.Revision, 10) + ": " + e.Kind.Error()
	if e.cause != nil && !e.redact {
		msg += ": " + e.cause.Error()
	}
	return msg
}

// Unwrap returns the failure kind and, when there is one, the cause.
func (e *DecodeError) Unwrap() []error {
	if e.cause == nil {
		return []error{e.Kind}
	}
	return []error{e.Kind, e.cause}
}
