// Package storage owns the formats of what kube-apiserver keeps in etcd and
// what it serves from it, for reading: the built-in resource table (key
// layout, storage version, scope, short names, categories, field labels),
// kube-apiserver's EncryptionConfiguration and its value transformers, the
// decoding of one stored value into an object, and the encodings a client
// can ask for (JSON, protobuf, PartialObjectMetadata, YAML, the watch stream
// framings: served.go). Which of them an HTTP request gets (kube-apiserver's
// content negotiation) is libs/kube/negotiate's.
//
// It uses the ecosystem's own codecs only: k8s.io/api types in a private
// scheme, k8s.io/apimachinery's JSON and protobuf serializers (the storage
// envelope is "k8s\x00" + runtime.Unknown), k8s.io/apiserver's transformers
// for aescbc, aesgcm, secretbox and identity. Nothing here parses protobuf or
// ciphertext by hand.
//
// Invariants:
//   - Decode once. A stored value is decrypted and decoded once into an
//     Object, which is then only read: its encodings are produced from it
//     without mutating it, so one Object may be encoded by many goroutines.
//   - Never serve a value it could not decode. Every failure is a
//     *DecodeError wrapping one of the sentinel errors (ErrUnknownKind,
//     ErrWrongKind, ErrCorrupt, ErrNotObject, ErrDecrypt,
//     ErrUnsupportedProvider); there is no partial object. Bad input never
//     panics.
//   - Values read exactly as kube-apiserver reads them: the transformer of
//     the group-resource from the encryption configuration (identity when
//     none), with the etcd key as authenticated data; metadata.resourceVersion
//     set to the key's mod revision.
//
// Conversions to another served version are done where they need none of
// kube-apiserver's internal types (Resource.Convert: events.k8s.io/v1
// Events from core v1 ones, versions whose Go types have the same fields,
// and v1 CustomResourceDefinitions from the stored v1beta1 ones through
// apiextensions-apiserver's own internal type). Not done here (yet), and so not served from a cache built on it:
// the other conversions (autoscaling/v1 HPAs: see Resource.NeedsConversion); kube-apiserver's decode-time defaulting beyond
// what an object it wrote itself can lack (readAsKubeAPIServer); CRD schema
// defaulting and pruning on read; KMS.
//
// It must never log, and never put into an error message, any byte of a
// decrypted value (errors about an encrypted value name the step that
// failed, not what the decoder saw), and never hold encryption keys outside
// the transformers. It does not talk to etcd, KMS plugins or the network.
package storage
