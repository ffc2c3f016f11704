package storage

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/server/options/encryptionconfig"
	"k8s.io/apiserver/pkg/storage/value"
)

// Test keys only: 32 bytes each, base64.
const (
	key1 = "MTIzNDU2Nzg5MDEyMzQ1Njc4OTAxMjM0NTY3ODkwMTI="
	key2 = "YWJjZGVmZ2hpamtsbW5vcHFyc3R1dnd4eXphYmNkZWY="
)

func configWith(providers string) string {
	return `apiVersion: apiserver.config.k8s.io/v1
kind: EncryptionConfiguration
resources:
- resources: ["secrets"]
  providers:
` + providers
}

var providerConfigs = map[string]string{
	"aescbc": `  - aescbc:
      keys:
      - name: key1
        secret: ` + key1 + `
      - name: key2
        secret: ` + key2 + `
  - identity: {}
`,
	"aesgcm": `  - aesgcm:
      keys:
      - name: key1
        secret: ` + key1 + `
  - identity: {}
`,
	"secretbox": `  - secretbox:
      keys:
      - name: key1
        secret: ` + key1 + `
  - identity: {}
`,
	"identity": `  - identity: {}
  - aescbc:
      keys:
      - name: key1
        secret: ` + key1 + `
`,
}

var secretsGR = schema.GroupResource{Resource: "secrets"}

func secretFixture(t testing.TB, c *Codec) (res *Resource, key, plain []byte) {
	t.Helper()
	res = NewBuiltinTable().Lookup(gvr("", "v1", "secrets"))
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "db", Namespace: "prod"}, Type: corev1.SecretTypeOpaque,
		Data: map[string][]byte{"password": []byte("hunter2")}}
	return res, []byte("/registry/secrets/prod/db"), storeProtobuf(t, c, s, res.StorageGVK())
}

// encryptedSecret is the fixture Secret as kube-apiserver stores it with
// secrets configured for provider, and a codec configured alike.
type encryptedSecret struct {
	enc    *Encryption
	c      *Codec
	res    *Resource
	key    []byte
	stored []byte
}

func newEncryptedSecret(t testing.TB, provider string) encryptedSecret {
	t.Helper()
	enc, err := ParseEncryptionConfig([]byte(configWith(providerConfigs[provider])))
	if err != nil {
		t.Fatal(err)
	}
	c := newTestCodec(t, enc)
	res, key, plain := secretFixture(t, c)
	stored, err := enc.Transformer(secretsGR).TransformToStorage(context.Background(), plain, authenticatedData(key))
	if err != nil {
		t.Fatal(err)
	}
	return encryptedSecret{enc: enc, c: c, res: res, key: key, stored: stored}
}

func TestEncryptedRoundTrip(t *testing.T) {
	for name := range providerConfigs {
		t.Run(name, func(t *testing.T) {
			es := newEncryptedSecret(t, name)
			c, res, key, stored := es.c, es.res, es.key, es.stored
			wantEncrypted := name != "identity"
			if wantEncrypted != bytes.HasPrefix(stored, []byte("k8s:enc:"+name+":v1:key1:")) || bytes.Contains(stored, []byte("hunter2")) == wantEncrypted {
				t.Fatalf("stored value %q", stored[:min(len(stored), 24)])
			}
			obj, err := c.Decode(context.Background(), res, key, stored, 5)
			if err != nil {
				t.Fatal(err)
			}
			if obj.Encrypted != wantEncrypted || string(obj.Runtime().(*corev1.Secret).Data["password"]) != "hunter2" {
				t.Fatalf("decoded %+v", obj)
			}
			if !wantEncrypted {
				return
			}
			// With aesgcm the key authenticates the value (aescbc and
			// secretbox ignore authenticated data, in kube-apiserver too):
			// ciphertext moved to another key does not decrypt, and the
			// error quotes no plaintext.
			_, err = c.Decode(context.Background(), res, []byte("/registry/secrets/prod/other"), stored, 5)
			if name == "aesgcm" && !errors.Is(err, ErrDecrypt) {
				t.Errorf("moved value: %v", err)
			}
			if err != nil && strings.Contains(err.Error(), "hunter2") {
				t.Errorf("error quotes plaintext: %v", err)
			}
			// Tampered ciphertext.
			bad := bytes.Clone(stored)
			bad[len(bad)-1] ^= 0xff
			if _, err := c.Decode(context.Background(), res, key, bad, 5); err == nil {
				t.Errorf("tampered value decoded")
			} else if !errors.Is(err, ErrDecrypt) && !errors.Is(err, ErrCorrupt) {
				t.Errorf("tampered value: %v", err)
			}
			// A key the configuration does not have.
			unknownKey := bytes.Replace(stored, []byte(":key1:"), []byte(":key9:"), 1)
			if _, err := c.Decode(context.Background(), res, key, unknownKey, 5); !errors.Is(err, ErrDecrypt) {
				t.Errorf("unknown key: %v", err)
			}
			// Other resources are not encrypted by this configuration.
			if _, ok := es.enc.Transformer(schema.GroupResource{Resource: "configmaps"}).(value.Transformer); !ok {
				t.Error("no transformer for configmaps")
			}
		})
	}
}

// TestReadsWhatKubeAPIServerWrites encrypts with kube-apiserver's own loader
// (k8s.io/apiserver's encryptionconfig) and decrypts with this package.
func TestReadsWhatKubeAPIServerWrites(t *testing.T) {
	for name, providers := range providerConfigs {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "enc.yaml")
			if err := os.WriteFile(path, []byte(configWith(providers)), 0o600); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			t.Cleanup(cancel)
			kube, err := encryptionconfig.LoadEncryptionConfig(ctx, path, false, "test")
			if err != nil {
				t.Fatal(err)
			}
			enc, err := LoadEncryptionConfig(path)
			if err != nil {
				t.Fatal(err)
			}
			c := newTestCodec(t, enc)
			res, key, plain := secretFixture(t, c)
			stored, err := encryptionconfig.StaticTransformers(kube.Transformers).TransformerForResource(secretsGR).
				TransformToStorage(ctx, plain, authenticatedData(key))
			if err != nil {
				t.Fatal(err)
			}
			obj, err := c.Decode(ctx, res, key, stored, 8)
			if err != nil {
				t.Fatal(err)
			}
			if string(obj.Runtime().(*corev1.Secret).Data["password"]) != "hunter2" {
				t.Fatal("wrong plaintext")
			}
		})
	}
}

func TestEncryptionConfigKMSAndWildcards(t *testing.T) {
	cfg := `apiVersion: apiserver.config.k8s.io/v1
kind: EncryptionConfiguration
resources:
- resources: ["secrets"]
  providers:
  - kms:
      apiVersion: v2
      name: vault
      endpoint: unix:///var/run/kms.sock
  - aesgcm:
      keys:
      - name: key1
        secret: ` + key1 + `
- resources: ["*.apps"]
  providers:
  - secretbox:
      keys:
      - name: key1
        secret: ` + key1 + `
`
	enc, err := ParseEncryptionConfig([]byte(cfg))
	if err != nil {
		t.Fatal(err)
	}
	c := newTestCodec(t, enc)
	res, key, plain := secretFixture(t, c)
	if _, err := c.Decode(context.Background(), res, key, []byte("k8s:enc:kms:v2:vault:\x0a\x01x"), 1); !errors.Is(err, ErrUnsupportedProvider) {
		t.Errorf("KMS value: %v", err)
	}
	stored, err := enc.Transformer(secretsGR).TransformToStorage(context.Background(), plain, authenticatedData(key))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(stored, []byte("k8s:enc:aesgcm:v1:key1:")) {
		t.Fatalf("KMS skipped, aesgcm should write: %q", stored[:20])
	}
	if _, err := c.Decode(context.Background(), res, key, stored, 1); err != nil {
		t.Errorf("aesgcm value next to a KMS provider: %v", err)
	}
	// No identity provider for secrets: plaintext is refused, as by
	// kube-apiserver.
	if _, err := c.Decode(context.Background(), res, key, plain, 1); !errors.Is(err, ErrDecrypt) {
		t.Errorf("plaintext without identity: %v", err)
	}
	// "*.apps" covers deployments.
	if got, _ := enc.Transformer(schema.GroupResource{Group: "apps", Resource: "deployments"}).TransformToStorage(context.Background(), []byte("x"), authenticatedData("k")); !bytes.HasPrefix(got, []byte("k8s:enc:secretbox:v1:key1:")) {
		t.Errorf("*.apps not applied: %q", got)
	}
}

func TestEncryptionConfigErrors(t *testing.T) {
	for name, cfg := range map[string]string{
		"empty":        "",
		"not a config": "apiVersion: v1\nkind: Pod\n",
		"unknown field": `apiVersion: apiserver.config.k8s.io/v1
kind: EncryptionConfiguration
bogus: 1
resources: []`,
		"bad aes key": configWith(`  - aescbc:
      keys:
      - name: k
        secret: c2hvcnQ=
`),
		"secret not base64": configWith(`  - secretbox:
      keys:
      - name: k
        secret: "!!!"
`),
		"no keys":          configWith("  - aesgcm:\n      keys: []\n"),
		"two kinds in one": configWith("  - identity: {}\n    aesgcm:\n      keys:\n      - name: k\n        secret: " + key1 + "\n"),
		"no provider":      configWith("  - {}\n"),
		"masked by wildcard": `apiVersion: apiserver.config.k8s.io/v1
kind: EncryptionConfiguration
resources:
- resources: ["*.*"]
  providers: [{identity: {}}]
- resources: ["secrets"]
  providers: [{identity: {}}]
`,
	} {
		t.Run(name, func(t *testing.T) {
			_, err := ParseEncryptionConfig([]byte(cfg))
			if err == nil {
				t.Fatal("accepted")
			}
			if strings.Contains(err.Error(), key1) {
				t.Errorf("error quotes key material: %v", err)
			}
		})
	}
	if _, err := LoadEncryptionConfig(filepath.Join(t.TempDir(), "missing.yaml")); err == nil {
		t.Error("missing file accepted")
	}
}

func TestErrorsAfterDecryptionQuoteNoPlaintext(t *testing.T) {
	es := newEncryptedSecret(t, "aesgcm")
	enc, c, res, key := es.enc, es.c, es.res, es.key
	for _, plain := range []string{
		`{"kind":"Secret","apiVersion":"v1","type":hunter2}`,
		`{"kind":"Secret","apiVersion":"v1","data":{"password":"hunter2!"}}`,
		`{"kind":"Secret","apiVersion":"v1","data":{"password":7}}`,
	} {
		stored, err := enc.Transformer(secretsGR).TransformToStorage(context.Background(), []byte(plain), authenticatedData(key))
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.Decode(context.Background(), res, key, stored, 2)
		if !errors.Is(err, ErrCorrupt) {
			t.Fatalf("%s: %v", plain, err)
		}
		if msg := err.Error(); strings.Contains(msg, "hunter2") || strings.Contains(msg, "invalid character") || strings.Contains(msg, "7") {
			t.Errorf("error quotes the decrypted value: %s", msg)
		}
	}
}
