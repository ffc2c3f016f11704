package cache

import heraldv1 "herald.dev/libs/proto/herald/v1"

var benchStreams = []struct {
	name string
	req  *heraldv1.WatchRequest
}{
	{"hub", &heraldv1.WatchRequest{Resource: "pods", Follow: true, OmitUnchangedPrev: true}},
	{"hub-protobuf", &heraldv1.WatchRequest{Resource: "pods", Follow: true, OmitUnchangedPrev: true, WithProtobuf: true}},
	{"older-client", &heraldv1.WatchRequest{Resource: "pods", Follow: true}},
}
