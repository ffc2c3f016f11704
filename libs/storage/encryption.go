package storage

import (
	"bytes"
	"context"
	"crypto/aes"
	"crypto/cipher"
	"encoding/base64"
	"errors"
	"fmt"
	"os"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apiserver/pkg/apis/apiserver"
	apiserverv1 "k8s.io/apiserver/pkg/apis/apiserver/v1"
	"k8s.io/apiserver/pkg/storage/value"
	aestransformer "k8s.io/apiserver/pkg/storage/value/encrypt/aes"
	"k8s.io/apiserver/pkg/storage/value/encrypt/identity"
	"k8s.io/apiserver/pkg/storage/value/encrypt/secretbox"
)

// The value prefixes kube-apiserver writes (k8s.io/apiserver
// pkg/server/options/encryptionconfig). A value starting with encPrefix is
// encrypted; the provider name follows.
const (
	encPrefix       = "k8s:enc:"
	aesCBCPrefix    = "k8s:enc:aescbc:v1:"
	aesGCMPrefix    = "k8s:enc:aesgcm:v1:"
	secretboxPrefix = "k8s:enc:secretbox:v1:"
)

// Encryption holds the read side of kube-apiserver's encryption at rest: one
// transformer per group-resource, built from an EncryptionConfiguration
// (apiserver.config.k8s.io/v1). Like kube-apiserver's prefix transformers,
// reading tries the configured provider whose prefix the value carries, so
// values written under any configured key or provider (and plaintext when
// identity is configured) read back during a key rotation.
//
// Why not encryptionconfig.LoadEncryptionConfig itself: it starts gRPC
// clients and health probes for KMS plugins (Herald has none, and a KMS read
// would block for the plugin's timeout on every value), registers metrics on
// the global registry in its init, and validates with CEL machinery Herald
// does not need. The file is decoded with the same scheme and codecs, and the
// transformers are the same k8s.io/apiserver ones with the same prefixes; a
// test checks values encrypted by kube-apiserver's own loader read here.
//
// KMS providers in the file are accepted and skipped: their values fail with
// ErrUnsupportedProvider, and every other resource keeps working. A nil
// *Encryption means no encryption configured (every resource identity).
// Safe for concurrent use.
type Encryption struct {
	byGR map[schema.GroupResource]value.Transformer
}

// LoadEncryptionConfig reads an EncryptionConfiguration file.
func LoadEncryptionConfig(path string) (*Encryption, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("encryption config: %w", err)
	}
	enc, err := ParseEncryptionConfig(data)
	if err != nil {
		return nil, fmt.Errorf("encryption config %q: %w", path, err)
	}
	return enc, nil
}

// ParseEncryptionConfig builds the transformers of an EncryptionConfiguration
// given as YAML or JSON. Errors never quote key material.
func ParseEncryptionConfig(data []byte) (*Encryption, error) {
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, errors.New("empty EncryptionConfiguration")
	}
	scheme := runtime.NewScheme()
	if err := apiserver.AddToScheme(scheme); err != nil {
		return nil, err
	}
	if err := apiserverv1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	// Strict like kube-apiserver: an unknown or duplicate field is an error.
	codecs := serializer.NewCodecFactory(scheme, serializer.EnableStrict)
	obj, gvk, err := codecs.UniversalDecoder().Decode(data, nil, nil)
	if err != nil {
		return nil, fmt.Errorf("decoding EncryptionConfiguration: %w", err)
	}
	cfg, ok := obj.(*apiserver.EncryptionConfiguration)
	if !ok {
		return nil, fmt.Errorf("got %v, want apiserver.config.k8s.io/v1 EncryptionConfiguration", gvk)
	}
	return newEncryption(cfg)
}

var anyGroupAnyResource = schema.GroupResource{Group: "*", Resource: "*"}

// newEncryption mirrors encryptionconfig.getTransformerOverridesAndKMSPluginProbes:
// per resource the providers in file order, and the same masking rules.
func newEncryption(cfg *apiserver.EncryptionConfiguration) (*Encryption, error) {
	perGR := map[schema.GroupResource][]value.PrefixTransformer{}
	for i, rc := range cfg.Resources {
		if len(rc.Resources) == 0 || len(rc.Providers) == 0 {
			return nil, fmt.Errorf("resources[%d]: needs resources and providers", i)
		}
		var transformers []value.PrefixTransformer
		for j, p := range rc.Providers {
			t, use, err := providerTransformer(p)
			if err != nil {
				return nil, fmt.Errorf("resources[%d].providers[%d]: %w", i, j, err)
			}
			if use {
				transformers = append(transformers, t)
			}
		}
		for _, res := range rc.Resources {
			gr := schema.ParseGroupResource(res)
			if _, masked := perGR[schema.GroupResource{Group: gr.Group, Resource: "*"}]; masked {
				return nil, fmt.Errorf("resource %q is masked by an earlier rule for its whole group", res)
			}
			if _, masked := perGR[anyGroupAnyResource]; masked {
				return nil, fmt.Errorf("resource %q is masked by an earlier rule for every resource", res)
			}
			perGR[gr] = append(perGR[gr], transformers...)
		}
	}
	e := &Encryption{byGR: make(map[schema.GroupResource]value.Transformer, len(perGR))}
	for gr, ts := range perGR {
		e.byGR[gr] = value.NewPrefixTransformers(errors.New("no matching prefix found"), ts...)
	}
	return e, nil
}

// providerTransformer returns the prefix transformer of one provider; use is
// false for KMS providers, which Herald does not run.
func providerTransformer(p apiserver.ProviderConfiguration) (t value.PrefixTransformer, use bool, err error) {
	n := 0
	for _, set := range []bool{p.AESGCM != nil, p.AESCBC != nil, p.Secretbox != nil, p.KMS != nil, p.Identity != nil} {
		if set {
			n++
		}
	}
	if n != 1 {
		return t, false, errors.New("a provider needs exactly one of aesgcm, aescbc, secretbox, kms, identity")
	}
	switch {
	case p.AESGCM != nil:
		t, err = aesTransformer(p.AESGCM.Keys, aestransformer.NewGCMTransformer, aesGCMPrefix)
	case p.AESCBC != nil:
		t, err = aesTransformer(p.AESCBC.Keys, func(b cipher.Block) (value.Transformer, error) {
			return aestransformer.NewCBCTransformer(b), nil
		}, aesCBCPrefix)
	case p.Secretbox != nil:
		t, err = secretboxTransformer(p.Secretbox.Keys)
	case p.KMS != nil:
		return t, false, nil
	case p.Identity != nil:
		t = value.PrefixTransformer{Transformer: identity.NewEncryptCheckTransformer(), Prefix: []byte{}}
	}
	return t, err == nil, err
}

func checkKeys(keys []apiserver.Key) error {
	if len(keys) == 0 {
		return errors.New("provider has no keys")
	}
	for i, k := range keys {
		if k.Name == "" {
			return fmt.Errorf("keys[%d] has no name", i)
		}
		if k.Secret == "" {
			return fmt.Errorf("key %q has no secret", k.Name)
		}
	}
	return nil
}

func aesTransformer(keys []apiserver.Key, fn func(cipher.Block) (value.Transformer, error), prefix string) (value.PrefixTransformer, error) {
	return keyedTransformer(keys, "AES", prefix, func(secret []byte) (value.Transformer, error) {
		block, err := aes.NewCipher(secret)
		if err != nil {
			return nil, err
		}
		return fn(block)
	})
}

func secretboxTransformer(keys []apiserver.Key) (value.PrefixTransformer, error) {
	return keyedTransformer(keys, "Secretbox", secretboxPrefix, func(secret []byte) (value.Transformer, error) {
		if len(secret) != 32 {
			return nil, fmt.Errorf("secretbox needs a 32-byte key, got %d", len(secret))
		}
		var key [32]byte
		copy(key[:], secret)
		return secretbox.NewSecretboxTransformer(key), nil
	})
}

// keyedTransformer is one provider: "<prefix><key name>:" selects the key,
// as in kube-apiserver's aesPrefixTransformer and secretboxPrefixTransformer.
func keyedTransformer(keys []apiserver.Key, what, prefix string, build func(secret []byte) (value.Transformer, error)) (value.PrefixTransformer, error) {
	if err := checkKeys(keys); err != nil {
		return value.PrefixTransformer{}, err
	}
	var perKey []value.PrefixTransformer
	for _, k := range keys {
		secret, err := base64.StdEncoding.DecodeString(k.Secret)
		if err != nil {
			return value.PrefixTransformer{}, fmt.Errorf("key %q: secret is not base64", k.Name)
		}
		tr, err := build(secret)
		if err != nil {
			return value.PrefixTransformer{}, fmt.Errorf("key %q: %w", k.Name, err)
		}
		perKey = append(perKey, value.PrefixTransformer{Transformer: tr, Prefix: []byte(k.Name + ":")})
	}
	return value.PrefixTransformer{
		Transformer: value.NewPrefixTransformers(fmt.Errorf("no matching key was found for the provided %s transformer", what), perKey...),
		Prefix:      []byte(prefix),
	}, nil
}

// transformer is kube-apiserver's lookup (encryptionconfig.transformerFromOverrides):
// the resource, then its group's "*", then "*.*", else identity, which
// refuses encrypted values.
func (e *Encryption) transformer(gr schema.GroupResource) value.Transformer {
	if e != nil {
		for _, k := range []schema.GroupResource{gr, {Group: gr.Group, Resource: "*"}, anyGroupAnyResource} {
			if t := e.byGR[k]; t != nil {
				return t
			}
		}
	}
	return identity.NewEncryptCheckTransformer()
}

// authenticatedData is kube-apiserver's etcd3 authenticatedDataString: the
// full etcd key authenticates the value, so ciphertext copied to another key
// does not decrypt.
type authenticatedData []byte

func (a authenticatedData) AuthenticatedData() []byte { return a }

// Transformer returns the transformer kube-apiserver uses for gr, for
// writers in tests and tools that need to produce what kube-apiserver
// stores.
func (e *Encryption) Transformer(gr schema.GroupResource) value.Transformer { return e.transformer(gr) }

// fromStorage turns a stored value into plaintext as kube-apiserver reads
// it. encrypted reports whether the value carried an encryption prefix.
func (e *Encryption) fromStorage(ctx context.Context, gr schema.GroupResource, key, stored []byte) (plain []byte, encrypted bool, kind error, cause error) {
	encrypted = bytes.HasPrefix(stored, []byte(encPrefix))
	if encrypted && !bytes.HasPrefix(stored, []byte(aesCBCPrefix)) &&
		!bytes.HasPrefix(stored, []byte(aesGCMPrefix)) && !bytes.HasPrefix(stored, []byte(secretboxPrefix)) {
		return nil, true, ErrUnsupportedProvider, fmt.Errorf("provider %q", providerName(stored))
	}
	out, _, err := e.transformer(gr).TransformFromStorage(ctx, stored, authenticatedData(key))
	if err != nil {
		if encrypted {
			// The transformers' messages name the step, never the data.
			return nil, true, ErrDecrypt, fmt.Errorf("provider %q: %w", providerName(stored), err)
		}
		// Plaintext where the configuration has no identity provider:
		// kube-apiserver fails the same read.
		return nil, false, ErrDecrypt, err
	}
	return out, encrypted, nil, nil
}

// providerName is the <provider> of "k8s:enc:<provider>:...", bounded so that
// garbage never makes a long message.
func providerName(stored []byte) string {
	rest := stored[len(encPrefix):]
	if i := bytes.IndexByte(rest, ':'); i >= 0 && i <= 32 {
		return string(rest[:i])
	}
	return "?"
}
