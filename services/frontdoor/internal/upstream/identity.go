package upstream

import (
	"errors"
	"strings"

	authenticationv1 "k8s.io/api/authentication/v1"
	"k8s.io/apiserver/pkg/authentication/user"
)

// How a user's identity travels upstream in Impersonate-* headers
// (setImpersonation), byte for byte as client-go's impersonating transport
// sends it, so that kube-apiserver reads back exactly the user frontdoor
// authenticated.

// extraHeaderName is the Impersonate-Extra-* header name of an extra's key:
// every byte a header name cannot hold (anything but an RFC 7230 token
// character), and '%' itself, becomes %XX in upper-case hex. kube-apiserver
// lower-cases the name's rest and unescapes it (url.PathUnescape), which
// gives back the key. url.PathEscape is not enough: it keeps ':', '@', ',',
// ';', '=' and others, which a header name cannot hold, and the transport
// refuses the request.
func extraHeaderName(key string) string {
	const hex = "0123456789ABCDEF"
	var b strings.Builder
	b.Grow(len(authenticationv1.ImpersonateUserExtraHeaderPrefix) + len(key))
	b.WriteString(authenticationv1.ImpersonateUserExtraHeaderPrefix)
	for i := 0; i < len(key); i++ {
		c := key[i]
		if c != '%' && isTokenByte(c) {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(hex[c>>4])
		b.WriteByte(hex[c&0xf])
	}
	return b.String()
}

// isTokenByte reports whether c may appear in an HTTP header name (RFC
// 7230's tchar).
func isTokenByte(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

// errIdentityNotForwardable: the user's name, uid, a group or an extra
// value holds a byte no header value can (a control character), so the
// identity cannot be impersonated upstream. Refused for this request only:
// the upstream is not at fault.
var errIdentityNotForwardable = errors.New("the user's identity holds characters that cannot be sent upstream in impersonation headers")

// forwardable reports whether u fits in header values: no control byte
// but horizontal tab (what the transport accepts).
func forwardable(u user.Info) bool {
	ok := func(s string) bool {
		for i := 0; i < len(s); i++ {
			if c := s[i]; (c < ' ' && c != '\t') || c == 0x7f {
				return false
			}
		}
		return true
	}
	if !ok(u.GetName()) || !ok(u.GetUID()) {
		return false
	}
	for _, g := range u.GetGroups() {
		if !ok(g) {
			return false
		}
	}
	for _, vs := range u.GetExtra() {
		for _, v := range vs {
			if !ok(v) {
				return false
			}
		}
	}
	return true
}
