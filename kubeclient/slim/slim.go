package slim

import (
	"bytes"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
)

// NewDynamicForConfig is dynamic.NewForConfig with decoded objects that leave out
// metadata.managedFields.
func NewDynamicForConfig(cfg *rest.Config) (*dynamic.DynamicClient, error) {
	rc, err := rest.UnversionedRESTClientFor(configFor(cfg))
	if err != nil {
		return nil, err
	}
	return dynamic.New(rc), nil
}

// configFor is dynamic.NewForConfig's configuration with the JSON decoder wrapped.
func configFor(cfg *rest.Config) *rest.Config {
	config := dynamic.ConfigFor(cfg)
	// As dynamic.NewForConfigAndClient: the dynamic client builds absolute paths.
	config.GroupVersion = nil
	config.APIPath = "/if-you-see-this-search-for-the-break"
	config.NegotiatedSerializer = newNegotiatedSerializer(config.NegotiatedSerializer)
	return config
}

// negotiatedSerializer hands out the JSON serializer wrapped (serializer); everything
// else is the inner one's.
type negotiatedSerializer struct {
	inner runtime.NegotiatedSerializer
	infos []runtime.SerializerInfo // built once: the rest client asks for every request
}

func newNegotiatedSerializer(inner runtime.NegotiatedSerializer) negotiatedSerializer {
	infos := append([]runtime.SerializerInfo(nil), inner.SupportedMediaTypes()...)
	for i := range infos {
		if infos[i].MediaType == runtime.ContentTypeJSON && infos[i].Serializer != nil {
			// The stream serializer (the watch events' envelope) is left alone: the
			// event's object is decoded by Serializer, which is wrapped.
			infos[i].Serializer = serializer{infos[i].Serializer}
		}
	}
	return negotiatedSerializer{inner: inner, infos: infos}
}

func (n negotiatedSerializer) SupportedMediaTypes() []runtime.SerializerInfo { return n.infos }

func (n negotiatedSerializer) EncoderForVersion(e runtime.Encoder, gv runtime.GroupVersioner) runtime.Encoder {
	return n.inner.EncoderForVersion(e, gv)
}

func (n negotiatedSerializer) DecoderToVersion(d runtime.Decoder, gv runtime.GroupVersioner) runtime.Decoder {
	return n.inner.DecoderToVersion(d, gv)
}

// serializer cuts metadata.managedFields out of what it decodes.
type serializer struct {
	runtime.Serializer
}

// Decode cuts what client-go would decode: an object (into an Unstructured, or
// nothing: a watch event's object), or a list's items (into an UnstructuredList,
// which is the only target client-go reads "items" of).
func (s serializer) Decode(data []byte, defaults *schema.GroupVersionKind, into runtime.Object) (runtime.Object, *schema.GroupVersionKind, error) {
	_, list := into.(*unstructured.UnstructuredList)
	return s.Serializer.Decode(WithoutManagedFields(data, list), defaults, into)
}

const managedFieldsKey = `"managedFields"`

// WithoutManagedFields returns data without the metadata.managedFields member of the
// JSON object it holds and, if list, without that of each element of its "items"
// array. data itself is returned when there is nothing to cut or it does not scan as
// a JSON object; otherwise a new slice (data is not modified: its buffer may be
// reused).
func WithoutManagedFields(data []byte, list bool) []byte {
	if !bytes.Contains(data, []byte(managedFieldsKey)) {
		return data
	}
	s := scanner{data: data}
	level := levelObject
	if list {
		level = levelList
	}
	if !s.object(s.space(0), level) {
		return data
	}
	if len(s.cuts) == 0 {
		return data
	}
	size := len(data)
	for _, c := range s.cuts {
		size -= c[1] - c[0]
	}
	out := make([]byte, 0, size)
	last := 0
	for _, c := range s.cuts {
		out = append(out, data[last:c[0]]...)
		last = c[1]
	}
	return append(out, data[last:]...)
}

// scanner finds the spans to cut. It checks the structure it walks through (objects,
// arrays, strings) and leaves the rest to the decoder; what it cuts is not validated
// (a malformed managedFields from the server would be dropped, not reported).
type scanner struct {
	data []byte
	cuts [][2]int // [from, to) byte ranges, in order
	end  int      // where the last value scanned ended
}

const (
	levelObject   = iota // the decoded object: its metadata is looked into
	levelList            // a decoded list: its metadata and items are looked into
	levelMetadata        // a metadata object: its managedFields member is cut
)

// object scans the JSON object at i (after whitespace), recording cuts by level,
// and leaves s.end just past its closing brace.
func (s *scanner) object(i, level int) bool {
	d := s.data
	if i >= len(d) || d[i] != '{' {
		return false
	}
	i = s.space(i + 1)
	if i < len(d) && d[i] == '}' {
		s.end = i + 1
		return true
	}
	prevEnd := -1 // where the previous member's value ended (-1: this is the first member)
	for {
		keyStart := i
		if !s.string(i) {
			return false
		}
		key := d[keyStart+1 : s.end-1]
		i = s.space(s.end)
		if i >= len(d) || d[i] != ':' {
			return false
		}
		i = s.space(i + 1)
		var ok bool
		switch {
		case level != levelMetadata && string(key) == "metadata" && i < len(d) && d[i] == '{':
			ok = s.object(i, levelMetadata)
		case level == levelList && string(key) == "items" && i < len(d) && d[i] == '[':
			ok = s.items(i)
		default:
			ok = s.value(i)
		}
		if !ok {
			return false
		}
		valEnd := s.end
		i = s.space(valEnd)
		if i >= len(d) {
			return false
		}
		isLast := d[i] == '}'
		if !isLast && d[i] != ',' {
			return false
		}
		if level == levelMetadata && string(key) == "managedFields" {
			switch {
			case prevEnd >= 0: // `, "managedFields": [...]`: from the previous value's end
				s.cuts = append(s.cuts, [2]int{prevEnd, valEnd})
				prevEnd = valEnd // what follows the cut starts there (a duplicate key is cut the same way)
			case !isLast: // the first member: through the comma after it
				s.cuts = append(s.cuts, [2]int{keyStart, s.space(i + 1)})
			default: // the only member
				s.cuts = append(s.cuts, [2]int{keyStart, valEnd})
			}
		} else {
			prevEnd = valEnd
		}
		if isLast {
			s.end = i + 1
			return true
		}
		i = s.space(i + 1)
	}
}

// items scans a list's items array, looking into each element's metadata.
func (s *scanner) items(i int) bool {
	d := s.data
	i = s.space(i + 1)
	if i < len(d) && d[i] == ']' {
		s.end = i + 1
		return true
	}
	for {
		var ok bool
		if i < len(d) && d[i] == '{' {
			ok = s.object(i, levelObject)
		} else {
			ok = s.value(i)
		}
		if !ok {
			return false
		}
		i = s.space(s.end)
		if i >= len(d) {
			return false
		}
		switch d[i] {
		case ']':
			s.end = i + 1
			return true
		case ',':
			i = s.space(i + 1)
		default:
			return false
		}
	}
}

// value skips the JSON value at i: a string, an object or array (brackets counted,
// strings skipped), or a literal (up to the next delimiter).
func (s *scanner) value(i int) bool {
	d := s.data
	if i >= len(d) {
		return false
	}
	switch d[i] {
	case '"':
		return s.string(i)
	case '{', '[':
		depth := 0
		for i < len(d) {
			switch d[i] {
			case '"':
				if !s.string(i) {
					return false
				}
				i = s.end
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					s.end = i + 1
					return true
				}
			}
			i++
		}
		return false
	default:
		start := i
		for i < len(d) {
			switch d[i] {
			case ',', '}', ']', ' ', '\t', '\r', '\n':
				s.end = i
				return i > start
			}
			i++
		}
		return false
	}
}

// string skips the JSON string starting at the quote at i (escapes honoured).
func (s *scanner) string(i int) bool {
	d := s.data
	if i >= len(d) || d[i] != '"' {
		return false
	}
	i++
	for {
		j := bytes.IndexAny(d[i:], `"\`)
		if j < 0 {
			return false
		}
		i += j
		if d[i] == '"' {
			s.end = i + 1
			return true
		}
		i += 2 // a backslash and the character it escapes
		if i > len(d) {
			return false
		}
	}
}

func (s *scanner) space(i int) int {
	d := s.data
	for i < len(d) && (d[i] == ' ' || d[i] == '\t' || d[i] == '\r' || d[i] == '\n') {
		i++
	}
	return i
}
