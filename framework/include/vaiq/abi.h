/* vaiq/abi.h - the binary contract between the vaiq host and a plugin library.
 *
 * A plugin library exports exactly one C symbol, vaiq_plugin_entry, returning
 * an array of descriptors. The host reads abi_version (always the first field)
 * before anything else and refuses any value but its own: the C++ interfaces
 * behind create() are only safe between identical SDK versions. The toolchain
 * tag guards the C++ runtime those interfaces are compiled against.
 *
 * Rules for changing this file: bump VAIQ_ABI_VERSION on any change to this
 * struct, to a virtual interface in the SDK, or to how an SDK object that
 * crosses the boundary allocates (a Tensor made on one side is freed on the
 * other). Never reorder fields.
 */
#ifndef VAIQ_ABI_H
#define VAIQ_ABI_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
#include <cstddef> /* defines __GLIBCXX__ / _LIBCPP_VERSION for the tag below */
#endif

/** The ABI revision of this SDK; a plugin must carry exactly this number. */
/* 19: the report kind (vaiq/report.hpp); AlgorithmStage::Written (written(), quantize_nested(), has_data());
 *     TensorSpool (vaiq/spool.hpp) and slice_at() in the SDK;
 * 18: the reader kind (vaiq/reader.hpp), VAIQ_OPTION_FLOAT_LIST and VAIQ_OPTION_ANY, forking_runner()'s rewrites;
 * 17: AlgorithmStage::Plan (draft(), keep_float(), set_per_channel(), mark_mixed_scales()), note(), channel_ranges()'s
 * batches; agreement()/agreements() take Batches (a set's first batches) and a reference variant; sensitivity() left
 * the context (the ranking is the mixed_precision plugins'), mixed_scale_tensors(), reported(); 16:
 * AlgorithmContext::agreements() runs batches on workers (VariantRun made per worker), forking_runner()'s threads; 15:
 * the descriptor's enabled_by and may_try, AlgorithmStage::Precision, AlgorithmContext::runs(); 14:
 * QuantParams::float_zero_point (HQQ), SharedExponentBlocks::rounding_mode; 13: block floating point and MX quant
 * types, QuantSpec/QuantParams::shared_exponent; 12: run_forking() rewrites values (RewriteFunction),
 * ModelRunner::can_fork(), AlgorithmContext::agreements(); 11: QuantRequest without enable_dpu (a target option),
 * BatchSet::Screening; 10: ModelRunner::run_forking(), AlgorithmContext::forking_runner(); 9: ModelRunner::run_taps(),
 * AlgorithmContext::agreement() and set_initializers(), the Corrections stage; 8: the algorithm kind
 * (vaiq/algorithm.hpp); 7: RangeObserver::order_free(), Pass::keeps_function(); 6: QuantSpec::dynamic, RangeObserver
 * statistics() and merge(), 4-bit types and block-wise parameters */
#define VAIQ_ABI_VERSION 19u

/** Name of the one symbol a plugin library exports. */
#define VAIQ_PLUGIN_ENTRY_NAME "vaiq_plugin_entry"

#define VAIQ_STRINGIFY_(x) #x
#define VAIQ_STRINGIFY(x) VAIQ_STRINGIFY_(x)

/* The toolchain tag names what C++ objects crossing the boundary depend on:
 * the C++ ABI, the standard library and its string/list ABI. GCC and Clang
 * share the Itanium ABI and libstdc++ on Linux, so they may be mixed. */
#if defined(_LIBCPP_VERSION)
#define VAIQ_STDLIB "libc++"
#elif defined(__GLIBCXX__)
#if defined(_GLIBCXX_USE_CXX11_ABI) && _GLIBCXX_USE_CXX11_ABI
#define VAIQ_STDLIB "libstdc++-cxx11"
#else
#define VAIQ_STDLIB "libstdc++-cxx98"
#endif
#else
#define VAIQ_STDLIB "unknown-stdlib"
#endif

#if defined(_MSC_VER)
#define VAIQ_CXX_ABI "msvc-" VAIQ_STRINGIFY(_MSC_VER)
#elif defined(__GNUC__)
#define VAIQ_CXX_ABI "itanium"
#else
#define VAIQ_CXX_ABI "unknown-abi"
#endif

/** Tag compared for equality by the host, e.g. "itanium/libstdc++-cxx11". */
#define VAIQ_TOOLCHAIN_TAG VAIQ_CXX_ABI "/" VAIQ_STDLIB

#ifdef __cplusplus
extern "C" {
#endif

/** What a plugin is; the host casts the object create() returns by this. */
typedef enum vaiq_plugin_kind {
    VAIQ_KIND_CALIBRATOR = 1, /**< observes tensors, returns ranges */
    VAIQ_KIND_FORMAT = 2,     /**< writes a quantization plan into the graph */
    VAIQ_KIND_TARGET = 3,     /**< what a device supports and requires */
    VAIQ_KIND_PASS = 4,       /**< a named graph rewrite */
    VAIQ_KIND_ALGORITHM = 5,  /**< changes what gets written, from data (GPTQ) */
    VAIQ_KIND_READER = 6,     /**< opens calibration and evaluation data (a folder of images) */
    VAIQ_KIND_REPORT = 7      /**< renders the run's report as a document beside it (the HTML page) */
} vaiq_plugin_kind;

/** Type of a plugin option. */
typedef enum vaiq_option_type {
    VAIQ_OPTION_BOOL = 1,
    VAIQ_OPTION_INT = 2,
    VAIQ_OPTION_FLOAT = 3,
    VAIQ_OPTION_STRING = 4,
    VAIQ_OPTION_STRING_LIST = 5,
    VAIQ_OPTION_FLOAT_LIST = 6, /**< numbers; a single number is a list of one */
    VAIQ_OPTION_ANY = 7         /**< any value (lists of lists, maps): one the recipe's schema checked, or the plugin checks */
} vaiq_option_type;

/** One option a plugin accepts. The default is written as YAML ("true", "0.5", "[a, b]"). */
typedef struct vaiq_option_descriptor {
    const char* name;
    uint32_t type; /**< a vaiq_option_type */
    const char* default_value;
    const char* doc; /**< one line */
} vaiq_option_descriptor;

/** Describes one plugin. A library may describe several. */
typedef struct vaiq_plugin_descriptor {
    uint32_t abi_version;  /**< == VAIQ_ABI_VERSION; first field, never moves */
    uint32_t struct_size;  /**< sizeof(vaiq_plugin_descriptor) when the plugin was built */
    const char* toolchain; /**< VAIQ_TOOLCHAIN_TAG when the plugin was built */
    uint32_t kind;         /**< a vaiq_plugin_kind */
    const char* name;      /**< unique within its kind: [a-z][a-z0-9_]* */
    const char* version;   /**< the plugin's own version, MAJOR.MINOR.PATCH */
    const char* summary;   /**< one line */
    const vaiq_option_descriptor* options;
    size_t option_count;
    /** Creates an instance (a vaiq::Calibrator*, Format*, Target*, Pass*, Algorithm*, Reader* or ReportWriter* by kind).
     *  Never throws: on failure returns NULL and writes a message into error. */
    void* (*create)(char* error, size_t error_size);
    /** Destroys an instance create() returned, in the module that allocated it. */
    void (*destroy)(void* instance);
    /** Algorithms: the recipe settings that run it without the recipe's
     *  `algorithms` naming it, separated by ", " (any of them):
     *  "extra_options.SmoothQuant" runs it when the setting is true (a number:
     *  when it is set), "weight_only_algorithm=gptq|awq_full" when the setting
     *  has one of the values; a setting that is not in effect (its switch off)
     *  runs nothing. NULL or "": only when named. */
    const char* enabled_by;
    /** Algorithms: the algorithms it may run through try_algorithm(), ", "-separated;
     *  the host checks the recipe's options for them before anything runs. */
    const char* may_try;
} vaiq_plugin_descriptor;

/** The exported entry: the library's descriptors and their count. */
typedef const vaiq_plugin_descriptor* const* (*vaiq_plugin_entry_fn)(size_t* count);

#ifdef __cplusplus
}
#endif

#endif /* VAIQ_ABI_H */
