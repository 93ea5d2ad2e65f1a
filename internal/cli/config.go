package cli

import (
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"slices"

	"github.com/spf13/pflag"
	"sigs.k8s.io/yaml"
)

// defaultConfig is read by `quiver server` when it exists and --config is
// not given.
const defaultConfig = "/etc/quiver/server.yaml"

// applyConfig sets the flags of flags from the YAML file at path: each key
// is a flag's name without "--" (listen: 0.0.0.0:7480), and a flag given on
// the command line wins over the file. With path "" the default file is
// read if there is one. An unknown key, a list or a value the flag refuses
// is an error naming the key.
func applyConfig(flags *pflag.FlagSet, path string) error {
	explicit := path != ""
	if !explicit {
		path = defaultConfig
	}
	data, err := os.ReadFile(path)
	if !explicit && errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	var settings map[string]any
	if err := yaml.Unmarshal(data, &settings); err != nil {
		return fmt.Errorf("config %s: not YAML key: value lines (%v)", path, err)
	}
	for _, key := range slices.Sorted(maps.Keys(settings)) {
		f := flags.Lookup(key)
		if f == nil || key == "config" || key == "help" {
			return fmt.Errorf("config %s: unknown setting %q: the settings are the flags of `quiver server --help`, without --", path, key)
		}
		if f.Changed {
			continue // the command line wins
		}
		var value string
		switch v := settings[key].(type) {
		case string:
			value = v
		case bool, float64:
			value = fmt.Sprint(v)
		case nil:
			continue
		default:
			return fmt.Errorf("config %s: %s: want a single value, not %T", path, key, v)
		}
		if err := flags.Set(key, value); err != nil {
			return fmt.Errorf("config %s: %s: %w", path, key, err)
		}
	}
	return nil
}
