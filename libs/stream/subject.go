package stream

import (
	"strconv"
	"strings"

	"herald.dev/libs/kube"
	heraldv1 "herald.dev/libs/proto/herald/v1"
)

// Stream subjects. Every record of one etcd revision goes to one subject, so
// that a consumer sees a revision whole or not at all.
const (
	// SubjectRoot is the prefix of every revision subject.
	SubjectRoot = "herald.ev"
	// SubjectMulti carries revisions that change keys of several resources or
	// partitions; every shard consumes it.
	SubjectMulti = SubjectRoot + "._multi"
	// SubjectOther carries changes to keys under the prefix that no
	// static resource owns: custom resources (ingest does not learn CRDs,
	// so their keys are no registered resource's there) and the rest. The
	// cache shard that serves custom resources consumes it; nobody else
	// needs it but the history checker.
	SubjectOther = SubjectRoot + "._other"
	// SubjectProgress carries progress and resync markers; every shard
	// consumes it.
	SubjectProgress = "herald.progress"
	// SubjectProgressRequest is a core NATS subject (not in the stream) on
	// which caches ask the ingest leader for a progress marker.
	SubjectProgressRequest = "herald.ctl.progress"
)

// Subjects are the subjects the stream is configured with.
func Subjects() []string { return []string{SubjectRoot + ".>", SubjectProgress} }

// token is the resource's token in stream subjects: its ID with the dots
// (which separate subject tokens) replaced.
// A resource served from another's stored values (kube.Resource.KeyOwner)
// reads that resource's subjects.
func token(r *kube.Resource) string { return strings.ReplaceAll(r.KeyOwner().ID(), ".", "_") }

// PartitionSubject is the subject of the revisions that change only objects
// of r in namespace partition p; SubjectOther for a custom resource (not
// partitioned).
func PartitionSubject(r *kube.Resource, p int) string {
	if r.Custom() {
		return SubjectOther
	}
	return SubjectRoot + "." + token(r) + "." + strconv.Itoa(p)
}

// Subject is the subject of a change to an object of r in namespace.
func Subject(r *kube.Resource, namespace string) string {
	return PartitionSubject(r, kube.Partition(namespace))
}

// Filter is the subject filter matching every partition of r; SubjectOther
// for a custom resource.
func Filter(r *kube.Resource) string {
	if r.Custom() {
		return SubjectOther
	}
	return SubjectRoot + "." + token(r) + ".*"
}

// SubjectOf is the subject of one revision's record: its resource and
// partition's when every change is to one of them, SubjectOther when no
// registered resource owns any of its keys, SubjectMulti otherwise.
func SubjectOf(reg *kube.Registry, changes []*heraldv1.Change) string {
	subject := ""
	for _, c := range changes {
		s := SubjectOther
		if r, ns, _, ok := reg.ParseKey(c.Key); ok {
			s = Subject(r, ns) // SubjectOther for a custom resource
		}
		switch subject {
		case "", s:
			subject = s
		default:
			return SubjectMulti
		}
	}
	return subject
}

// ParseSubject reads a resource partition's subject back: the resource's
// subject token (its ID with dots as underscores) and the partition. ok is
// false for every other subject, the multi, other and progress subjects
// included.
func ParseSubject(subject string) (resourceToken string, partition int, ok bool) {
	rest, found := strings.CutPrefix(subject, SubjectRoot+".")
	if !found {
		return "", 0, false
	}
	tok, part, found := strings.Cut(rest, ".")
	if !found || tok == "" {
		return "", 0, false
	}
	// Only the canonical decimal form: a subject that parses formats back
	// to itself.
	if part == "" || len(part) > 1 && part[0] == '0' || strings.Trim(part, "0123456789") != "" || len(part) > 3 {
		return "", 0, false
	}
	p, err := strconv.Atoi(part)
	if err != nil || p >= kube.Partitions {
		return "", 0, false
	}
	return tok, p, true
}
