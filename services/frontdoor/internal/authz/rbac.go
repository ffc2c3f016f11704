package authz

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/apiserver/pkg/authentication/serviceaccount"
	"k8s.io/apiserver/pkg/authentication/user"
)

// Policy is an RBAC policy loaded from Kubernetes manifests, evaluated as
// kube-apiserver's RBAC authorizer does for the requests Herald serves:
//
//   - deny by default; there are no deny rules;
//   - group system:masters is allowed everything (as kube-apiserver's
//     superuser group), whatever the manifests say;
//   - a ClusterRoleBinding grants its ClusterRole's rules in every namespace
//     and at the cluster scope;
//   - a RoleBinding grants its Role's or ClusterRole's rules only for
//     requests inside its namespace. A cluster-wide request (all namespaces)
//     is therefore allowed only by cluster-scoped grants, so a user bound in
//     some namespaces gets 403 there, as in Kubernetes;
//   - resourceNames restrict the request to objects of those names: a get,
//     or a list or watch of one object (its /watch/ path, or
//     fieldSelector=metadata.name=X); a list or watch of a collection
//     never matches a rule with resourceNames;
//   - a RoleBinding in namespace X also grants on Namespace X itself (its
//     request info's namespace is X, attributes.go);
//   - subresources match "resource/subresource" and "*/subresource";
//   - ClusterRoles with an aggregationRule get the rules of the ClusterRoles
//     their selectors match.
//
// A policy is immutable once loaded; reloads swap the whole policy.
type Policy struct {
	clusterRoles    map[string][]rbacv1.PolicyRule
	roles           map[string][]rbacv1.PolicyRule // "namespace/name"
	clusterBindings []rbacv1.ClusterRoleBinding
	bindings        map[string][]rbacv1.RoleBinding // by namespace
}

// Authorize reports whether a is allowed.
func (p *Policy) Authorize(a Attributes) bool {
	if Superuser(a) {
		return true
	}
	for i := range p.clusterBindings {
		b := &p.clusterBindings[i]
		if b.RoleRef.Kind == "ClusterRole" && appliesTo(a.User, b.Subjects, "") && rulesAllow(p.clusterRoles[b.RoleRef.Name], a) {
			return true
		}
	}
	if a.Namespace == "" || !a.ResourceRequest {
		return false
	}
	for i := range p.bindings[a.Namespace] {
		b := &p.bindings[a.Namespace][i]
		if !appliesTo(a.User, b.Subjects, b.Namespace) {
			continue
		}
		var rules []rbacv1.PolicyRule
		switch b.RoleRef.Kind {
		case "ClusterRole":
			rules = p.clusterRoles[b.RoleRef.Name]
		case "Role":
			rules = p.roles[b.Namespace+"/"+b.RoleRef.Name]
		}
		if rulesAllow(rules, a) {
			return true
		}
	}
	return false
}

// appliesTo reports whether one of the subjects is the user. A
// ServiceAccount subject without a namespace means the binding's.
func appliesTo(u user.Info, subjects []rbacv1.Subject, bindingNS string) bool {
	for _, s := range subjects {
		switch s.Kind {
		case rbacv1.UserKind:
			if s.Name == u.GetName() {
				return true
			}
		case rbacv1.GroupKind:
			if slices.Contains(u.GetGroups(), s.Name) {
				return true
			}
		case rbacv1.ServiceAccountKind:
			ns := bindingNS
			if s.Namespace != "" {
				ns = s.Namespace
			}
			if ns != "" && u.GetName() == serviceaccount.ServiceAccountUsernamePrefix+ns+":"+s.Name {
				return true
			}
		}
	}
	return false
}

func rulesAllow(rules []rbacv1.PolicyRule, a Attributes) bool {
	for i := range rules {
		if ruleAllows(&rules[i], a) {
			return true
		}
	}
	return false
}

// ruleAllows matches a rule as kube-apiserver's RBAC authorizer does
// (its RuleAllows: verbs, API groups, resources with subresources,
// resourceNames; non-resource URLs with a trailing "*").
func ruleAllows(r *rbacv1.PolicyRule, a Attributes) bool {
	if !hasOrStar(r.Verbs, a.Verb) {
		return false
	}
	if !a.ResourceRequest {
		for _, u := range r.NonResourceURLs {
			if u == "*" || u == a.Path || (strings.HasSuffix(u, "*") && strings.HasPrefix(a.Path, strings.TrimSuffix(u, "*"))) {
				return true
			}
		}
		return false
	}
	if !hasOrStar(r.APIGroups, a.APIGroup) || !resourceMatches(r.Resources, a.Resource, a.Subresource) {
		return false
	}
	return len(r.ResourceNames) == 0 || (a.Name != "" && slices.Contains(r.ResourceNames, a.Name))
}

// resourceMatches: "*", the resource (with its subresource, if any, as
// "resource/subresource"), or "*/subresource".
func resourceMatches(rules []string, resource, subresource string) bool {
	combined := resource
	if subresource != "" {
		combined += "/" + subresource
	}
	for _, r := range rules {
		if r == "*" || r == combined || (subresource != "" && r == "*/"+subresource) {
			return true
		}
	}
	return false
}

func hasOrStar(list []string, v string) bool {
	for _, s := range list {
		if s == "*" || s == v {
			return true
		}
	}
	return false
}

// LoadPolicy reads every manifest file; a file may hold several YAML
// documents, JSON, and v1 Lists of RBAC objects. Any other kind is an error:
// a Policy that silently dropped a binding would be worse than none.
func LoadPolicy(paths []string) (*Policy, error) {
	p := EmptyPolicy()
	var aggregated []rbacv1.ClusterRole
	var labelsOf = map[string]map[string]string{}
	for _, path := range paths {
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("rbac: %w", err)
		}
		dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096)
		for doc := 1; ; doc++ {
			var raw json.RawMessage
			if err := dec.Decode(&raw); err != nil {
				if errors.Is(err, io.EOF) {
					break
				}
				return nil, fmt.Errorf("rbac %s document %d: %w", path, doc, err)
			}
			if len(bytes.TrimSpace(raw)) == 0 || string(raw) == "null" {
				continue
			}
			if err := p.add(raw, &aggregated, labelsOf); err != nil {
				return nil, fmt.Errorf("rbac %s document %d: %w", path, doc, err)
			}
		}
	}
	for _, cr := range aggregated {
		rules := p.clusterRoles[cr.Name]
		for _, term := range cr.AggregationRule.ClusterRoleSelectors {
			sel, err := metav1.LabelSelectorAsSelector(&term)
			if err != nil {
				return nil, fmt.Errorf("rbac: ClusterRole %s aggregationRule: %w", cr.Name, err)
			}
			for name, lbls := range labelsOf {
				if name != cr.Name && sel.Matches(labels.Set(lbls)) {
					rules = append(rules, p.clusterRoles[name]...)
				}
			}
		}
		p.clusterRoles[cr.Name] = rules
	}
	return p, nil
}

func (p *Policy) add(raw json.RawMessage, aggregated *[]rbacv1.ClusterRole, labelsOf map[string]map[string]string) error {
	var tm metav1.TypeMeta
	if err := json.Unmarshal(raw, &tm); err != nil {
		return err
	}
	if tm.Kind == "List" || strings.HasSuffix(tm.Kind, "List") {
		var l struct {
			Items []json.RawMessage `json:"items"`
		}
		if err := json.Unmarshal(raw, &l); err != nil {
			return err
		}
		for _, it := range l.Items {
			if err := p.add(it, aggregated, labelsOf); err != nil {
				return err
			}
		}
		return nil
	}
	if tm.APIVersion != rbacv1.SchemeGroupVersion.String() {
		return fmt.Errorf("%s %q: only %s RBAC objects are supported", tm.Kind, tm.APIVersion, rbacv1.SchemeGroupVersion)
	}
	switch tm.Kind {
	case "ClusterRole":
		var o rbacv1.ClusterRole
		if err := json.Unmarshal(raw, &o); err != nil {
			return err
		}
		if o.Name == "" {
			return errors.New("ClusterRole without a name")
		}
		p.clusterRoles[o.Name] = append(p.clusterRoles[o.Name], o.Rules...)
		labelsOf[o.Name] = o.Labels
		if o.AggregationRule != nil {
			*aggregated = append(*aggregated, o)
		}
	case "Role":
		var o rbacv1.Role
		if err := json.Unmarshal(raw, &o); err != nil {
			return err
		}
		if o.Name == "" || o.Namespace == "" {
			return errors.New("Role needs metadata.name and metadata.namespace")
		}
		k := o.Namespace + "/" + o.Name
		p.roles[k] = append(p.roles[k], o.Rules...)
	case "ClusterRoleBinding":
		var o rbacv1.ClusterRoleBinding
		if err := json.Unmarshal(raw, &o); err != nil {
			return err
		}
		if o.RoleRef.Kind != "ClusterRole" {
			return fmt.Errorf("ClusterRoleBinding %s: roleRef.kind must be ClusterRole", o.Name)
		}
		p.clusterBindings = append(p.clusterBindings, o)
	case "RoleBinding":
		var o rbacv1.RoleBinding
		if err := json.Unmarshal(raw, &o); err != nil {
			return err
		}
		if o.Namespace == "" {
			return fmt.Errorf("RoleBinding %s needs metadata.namespace", o.Name)
		}
		if o.RoleRef.Kind != "Role" && o.RoleRef.Kind != "ClusterRole" {
			return fmt.Errorf("RoleBinding %s/%s: roleRef.kind must be Role or ClusterRole", o.Namespace, o.Name)
		}
		p.bindings[o.Namespace] = append(p.bindings[o.Namespace], o)
	default:
		return fmt.Errorf("kind %q is not an RBAC object", tm.Kind)
	}
	return nil
}

// ForbiddenReason words a denial as kube-apiserver's (responsewriters'
// forbiddenMessage).
func ForbiddenReason(a Attributes) string {
	if !a.ResourceRequest {
		return fmt.Sprintf("User %q cannot %s path %q", a.User.GetName(), a.Verb, a.Path)
	}
	resource := a.Resource
	if a.Subresource != "" {
		resource += "/" + a.Subresource
	}
	scope := "at the cluster scope"
	if a.Namespace != "" {
		scope = fmt.Sprintf("in the namespace %q", a.Namespace)
	}
	return fmt.Sprintf("User %q cannot %s resource %q in API group %q %s", a.User.GetName(), a.Verb, resource, a.APIGroup, scope)
}

// EmptyPolicy grants nothing (system:masters is still allowed everything):
// the policy of an RBAC directory that does not load.
func EmptyPolicy() *Policy {
	return &Policy{clusterRoles: map[string][]rbacv1.PolicyRule{}, roles: map[string][]rbacv1.PolicyRule{}, bindings: map[string][]rbacv1.RoleBinding{}}
}

// Superuser reports whether a's user is in system:masters, which is allowed
// everything (kube-apiserver's superuser group).
func Superuser(a Attributes) bool {
	return a.User != nil && slices.Contains(a.User.GetGroups(), user.SystemPrivilegedGroup)
}
