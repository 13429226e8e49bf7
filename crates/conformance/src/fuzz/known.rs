//! What ORT 1.31's CPU EP is known to do where the fuzzer's cases leave the specification:
//! where it is the lenient one ([`CPU_LENIENT`]), where the MLX EP follows ONNX instead
//! ([`ONNX_OVER_CPU`], [`ONNX_WHERE_CPU_REFUSES`]) and where its answer is shown wrong
//! ([`CPU_ANSWER_WRONG`]). Each entry says why; [`super::verdict::excuse`] reads them.

/// Why ORT's scale, zero-point and bias shapes for its integer-to-float matrix products are leniency.
const WIDE_QUANT_PARAMETERS: &str = "the CPU EP takes scale, zero point and bias shapes past the schema's one \
     element or one per column (it swaps a and b scales that look swapped and broadcasts others against \
     the product); the MLX EP refuses them with the reason";

/// Why a Cast's `saturate` other than 0 or 1 is the CPU EP's wrong answer.
const SATURATE_OUT_OF_RANGE: &str = "a `saturate` other than 0 or 1: the CPU EP's Cast then leaves its \
     output unwritten (whatever its memory held, for any target type); the MLX EP reads any value \
     other than 0 as 1";

/// An empty result with a dimension MLX cannot hold.
const EMPTY_PAST_32_BITS: &str = "an empty result with a dimension past 2^31 - 1: MLX holds dimensions as 32-bit \
     integers, so the EP refuses it by name where the CPU EP answers the empty tensor";
/// The mutations that write a huge value into a shape or an index.
const HUGE: &[&str] = &["index-out-of-range", "huge-shape-value"];

/// Spurious errors judged to be the CPU EP's leniency: `(op, mutations, text of the MLX
/// error, why)`. The MLX EP's error is the right answer there; the CPU EP answers input that
/// the operator's definition rules out.
pub const CPU_LENIENT: &[(&str, &[&str], &str, &str)] = &[
    (
        "com.microsoft:MultiHeadAttention",
        SHAPES,
        "must be [",
        "the CPU EP concatenates a past key or value whose head size disagrees with the new one's \
         without checking it (it copies rows of the wrong width)",
    ),
    (
        "com.microsoft:WordConvEmbedding",
        &["index-out-of-range", "huge-shape-value"],
        "a char id outside",
        "the CPU EP looks a char id up in the embedding table without checking it (it reads memory \
         outside the table)",
    ),
    (
        "com.microsoft:QLinearConcat",
        &["attr-out-of-range", "attr-nonsense-list", "size-0-dim", "shape-disagrees"],
        "must match exactly except for the concatenation axis",
        "the CPU EP skips empty inputs without checking their other dims, and counts their axis length \
         in the output anyway (rows it never writes)",
    ),
    ("com.microsoft:MatMulIntegerToFloat", SHAPES, "one element", WIDE_QUANT_PARAMETERS),
    ("com.microsoft:MatMulIntegerToFloat", SHAPES, "must hold one value per column", WIDE_QUANT_PARAMETERS),
    ("com.microsoft:DynamicQuantizeMatMul", SHAPES, "one element", WIDE_QUANT_PARAMETERS),
    ("com.microsoft:DynamicQuantizeMatMul", SHAPES, "must hold one value per column", WIDE_QUANT_PARAMETERS),
    (
        "com.microsoft:Inverse",
        SHAPES,
        "is not a stack of square matrices",
        "the CPU EP inverts a non-square input without checking its last two dims (it reads past the \
         matrix, and crashes on some shapes)",
    ),
    (
        "com.microsoft:SkipSimplifiedLayerNormalization",
        SHAPES,
        "cannot be broadcast",
        "the CPU EP reads a skip whose leading dims disagree with the input's without checking them",
    ),
    (
        "com.microsoft:SkipLayerNormalization",
        SHAPES,
        "cannot be broadcast",
        "the CPU EP reads a skip whose leading dims disagree with the input's without checking them",
    ),
    (
        "MeanVarianceNormalization",
        &["attr-out-of-range", "attr-nonsense-list"],
        "out of range for rank",
        "the CPU EP ignores axes it does not recognise (it knows only [0, 2, 3] and [2, 3])",
    ),
    (
        "MeanVarianceNormalization",
        &["attr-nonsense-list", "attr-out-of-range"],
        "Duplicate axes",
        "the CPU EP ignores axes it does not recognise (it knows only [0, 2, 3] and [2, 3])",
    ),
    (
        "Compress",
        SHAPES,
        "condition has",
        "the CPU EP takes a condition of any rank or length and ignores the values past the axis",
    ),
    (
        "Concat",
        &["attr-out-of-range", "attr-nonsense-list", "size-0-dim", "shape-disagrees"],
        "must match exactly except for the concatenation axis",
        "the CPU EP skips empty inputs without checking their other dims",
    ),
    (
        "TopK",
        &["huge-shape-value"],
        "is out of range for axis",
        "the CPU EP answers an empty top-k for k past the axis",
    ),
    ("GatherND", SHAPES, "do not fit data", "the CPU EP does not check that the indices' batch dims are the data's"),
    ("ConstantOfShape", HUGE, "is outside 0..=2^31-1", EMPTY_PAST_32_BITS),
    ("CenterCropPad", HUGE, "is outside 0..=2^31-1", EMPTY_PAST_32_BITS),
    ("OneHot", HUGE, "is outside 0..=2^31-1", EMPTY_PAST_32_BITS),
    ("Expand", HUGE, "outside MLX's 32-bit range", EMPTY_PAST_32_BITS),
    (
        "Pad",
        &["shape-disagrees", "size-0-dim", "rank-0", "rank-over-6", "index-out-of-range", "huge-shape-value"],
        "pads crop more than the input has",
        "the CPU EP crops more than an axis holds and pads on from there (an input of 1 element with \
         pads [-2, 2] gives 1 element of padding); ONNX leaves it undefined and its reference \
         implementation refuses it",
    ),
    (
        "com.microsoft:Pad",
        &["index-out-of-range", "huge-shape-value"],
        "pads crop more than the input has",
        "the CPU EP crops more than an axis holds and pads on from there (an input of 1 element with \
         pads [-2, 2] gives 1 element of padding), as its ONNX Pad does",
    ),
    (
        "DFT",
        &["index-out-of-range", "huge-shape-value"],
        "dft_length 0 is not positive",
        "the CPU EP answers an empty spectrum for dft_length 0, which ONNX's reference implementation \
         refuses, as the MLX EP does",
    ),
    (
        "DFT",
        &["index-out-of-range", "huge-shape-value"],
        "the MLX EP computes at most",
        "a transform of more points than the MLX EP's limit (it multiplies by a dense transform \
         matrix): a run-time dft_length past it is refused by name (a static signal axis past it is \
         left to the CPU EP when the model is loaded)",
    ),
    (
        "STFT",
        SHAPES,
        "it must be one axis",
        "the CPU EP takes a window of any rank and reads its first dimension as the frame length",
    ),
    (
        "com.microsoft:GatherBlockQuantized",
        &["index-out-of-range", "huge-shape-value"],
        "indices out of range",
        "the CPU EP does not check indices (it answers zeros for rows past the table)",
    ),
];

/// The mutations that change the shapes fed.
const SHAPES: &[&str] = &["shape-disagrees", "size-0-dim", "rank-0", "rank-over-6"];

/// Why ONNX Attention's QK output differs from ORT's for modes 1 to 3.
const QK_MODES: &str = "qk_matmul_output_mode 1 to 3: the MLX EP's QK output is the one ONNX's function body for \
     Attention gives (after the softcap, after the mask term, the probabilities), as its node tests check; \
     ORT's CPU EP returns the scaled scores for every mode";

/// Different answers where the MLX EP follows ONNX's definition and ORT's CPU EP does not:
/// `(op, attribute, value, why)` (a string or integer attribute's value); counted as
/// *lenient*.
pub const ONNX_OVER_CPU: &[(&str, &str, &str, &str)] = &[
    (
        "Resize",
        "coordinate_transformation_mode",
        "align_corners",
        "align_corners where `in * scale` is not whole: the MLX EP divides by the unrounded \
         resized length, as ONNX defines it (and its node tests check); ORT's CPU EP by the rounded one",
    ),
    (
        "Resize",
        "coordinate_transformation_mode",
        "tf_crop_and_resize",
        "tf_crop_and_resize where `in * scale` is not whole: the MLX EP divides by the unrounded \
         resized length, as ONNX defines it; ORT's CPU EP by the rounded one",
    ),
];

/// Different answers where ORT's CPU EP answers wrongly or has no defined answer, shown by
/// hand: `(op, mutation, why)`; counted as *lenient* (never an answer where the CPU EP raised).
/// GridSample's NaN or infinite coordinates (both domains' forms are one kernel in ORT).
const GRID_SAMPLE_NAN: &str = "a NaN or infinite grid coordinate: the CPU EP casts it to an integer index, which C++ \
     leaves undefined (here it reads the first pixel even with zeros padding); the MLX EP reads no \
     pixel for it (zeros padding) or the clamped or reflected index";

/// ReduceSum and ReduceL1 of int64 values past 2^53.
const INT64_SUMS: &str = "an int64 sum past 2^53: ORT's CPU EP sums integers in double, rounding past 2^53 and \
     saturating past 2^63; the MLX EP's int64 sum is exact (wrapping past 2^63, as NumPy's)";

/// A long DFT whose length is not a power of two.
const LONG_DFT: &str = "a long DFT whose length is not a power of two: the CPU EP's direct transform accumulates \
     float32 twiddle error (100000 bins of 9 samples: a bin of -0.0420735 where NumPy's float64 \
     FFT gives -0.0420843; 8190 samples: 7.50853 for 7.49467); the MLX EP's FFT is within 1e-5 \
     relative of NumPy's";

/// Why ORT's elementwise int64 Max and Min are wrong at some values past 32 bits.
const INT64_MIN_MAX: &str = "an int64 value just past 32 bits: ORT 1.31's CPU EP, taking the Max of [[42, -3, 5, 7]] \
     and the scalar 2^31, answers [[42, 2^31, 5, 7]] (and the Min with -2^31 - 1 keeps -42 and -5); with \
     2^32 + 5 or 2^40 it is right; the MLX EP gives the maximum and the minimum";

pub const CPU_ANSWER_WRONG: &[(&str, &str, &str)] = &[
    (
        "com.microsoft:DynamicQuantizeLSTM",
        "shape-disagrees",
        "a batch of 2 to 4 entries with at most 256 hidden units, or of more than 4: ORT's CPU kernel \
         splits it across its threads and quantizes each part's hidden values apart, so its answer \
         depends on its thread count; the MLX EP quantizes the whole batch, ORT's answer on one \
         thread (checked: ORT with intra_op_num_threads=1 matches the MLX EP within 1e-7 where its \
         default differs by 1e-3)",
    ),
    ("DFT", "index-out-of-range", LONG_DFT),
    ("DFT", "optional-input-removed", LONG_DFT),
    ("ReduceSum", "huge-shape-value", INT64_SUMS),
    ("ReduceSum", "index-out-of-range", INT64_SUMS),
    ("ReduceL1", "huge-shape-value", INT64_SUMS),
    ("ReduceL1", "index-out-of-range", INT64_SUMS),
    (
        "ReduceMax",
        "huge-shape-value",
        "an int64 value beyond 32 bits: ORT 1.31's CPU EP, reducing a whole int64 tensor (no axes), \
         misses some such maxima (the maximum of [1, 3000000000, 0, ...] comes out as 1; with axes \
         it is right); the MLX EP gives the maximum",
    ),
    (
        "LRN",
        "attr-out-of-range",
        "a bias near 0 (the mutation writes 0): the CPU EP keeps each channel's window sum as a running \
         sum (the next square added, the last one subtracted), whose cancellation then dominates the \
         denominator (size 1, alpha 0.002: 22.437 where x / sqrt(alpha x^2) is 22.3607); the MLX EP sums \
         each window directly (22.36068)",
    ),
    ("Cast", "attr-out-of-range", SATURATE_OUT_OF_RANGE),
    ("CastLike", "attr-out-of-range", SATURATE_OUT_OF_RANGE),
    (
        "com.microsoft:WordConvEmbedding",
        "nan-inf",
        "a NaN embedding or filter: the CPU EP's tanh clamps its argument to [-9, 9] with vector \
         min/max, which turn NaN into a bound, so a NaN convolution comes out as -1 or 1; the MLX EP's \
         tanh of NaN is NaN",
    ),
    (
        "MaxRoiPool",
        "nan-inf",
        "a NaN in a bin: the CPU EP's running `std::max(value, maximum)` takes a NaN and lets the \
         next value replace it, so its answer is NaN only where the bin's last element is, else the \
         maximum of what follows the last NaN; the MLX EP's bin maximum is NaN wherever a NaN is",
    ),
    (
        "com.microsoft:DynamicQuantizeMatMul",
        "nan-inf",
        "A is quantized as DynamicQuantizeLinear quantizes (see there): the CPU EP's range of NaN input \
         depends on its vectorized min/max, giving a NaN scale and product for some lengths; the MLX \
         EP passes NaN over (quantized to the zero point's 0)",
    ),
    (
        "ai.onnx.ml:LinearClassifier",
        "attr-out-of-range",
        "a NaN or infinite coefficient or intercept makes a class's score NaN: the CPU EP's argmax \
         (a strict > scan) and its vectorized softmax pass a NaN over by position; the MLX EP's \
         scores and probabilities carry the NaN",
    ),
    (
        "Det",
        "nan-inf",
        "an infinite entry has no defined determinant: the CPU EP (Eigen) expands matrices up to 4 x 4 \
         by closed-form cofactors and larger ones by LU, so where an infinity meets a zero or another \
         infinity its NaN or infinity depends on the formula; the MLX EP eliminates every size by LU \
         (both answer NaN for a matrix holding NaN)",
    ),
    (
        "com.microsoft:Inverse",
        "nan-inf",
        "an infinite entry has no defined inverse: where an infinity meets a zero or another infinity \
         the NaN or infinity of each entry depends on the elimination order; both EPs answer NaN for a \
         matrix holding NaN",
    ),
    (
        "Unique",
        "nan-inf",
        "the CPU EP keys its unique values in an ordered map, where a NaN compares equal to whatever it \
         meets, so a NaN merges with another value; the MLX EP keeps one NaN, as NumPy's unique (ONNX's \
         reference) does",
    ),
    (
        "GlobalMaxPool",
        "nan-inf",
        "over two or three spatial axes the CPU EP's float max has no fixed answer for NaN: by where the \
         NaN falls it gives NaN, the max of the other values, or a partial max; the MLX EP gives NaN",
    ),
    (
        "MaxPool",
        "nan-inf",
        "over two or three spatial axes the CPU EP's max has no fixed answer for NaN (float32 and \
         float16): by where the NaN falls in a window it gives NaN or the others' max; the MLX EP \
         gives NaN in float32 and passes NaN over in half types",
    ),
    (
        "TopK",
        "nan-inf",
        "the CPU EP's comparator has no order for NaN, so where a NaN lands depends on its selection \
         algorithm (top 4 of [NaN, 1, .., 9] gives [9, 8, NaN, 7]); the MLX EP sorts NaN first",
    ),
    (
        "DynamicQuantizeLinear",
        "nan-inf",
        "the CPU EP's range of an all-NaN input depends on its length (its vectorized min/max): 5 \
         NaN give scale 1, 20 give NaN; the MLX EP passes NaN over (scale 1, zero point 0)",
    ),
    (
        "Clip",
        "huge-shape-value",
        "the CPU EP clips int64 by a bound of exactly 2^31 wrongly (Clip([7, -1, 300], max=2^31) gives \
         [2^31, -1, 2^31]; 2^31 - 1 and 2^40 are right)",
    ),
    (
        "chain:dynamic-quant-matmul",
        "nan-inf",
        "the chain starts with DynamicQuantizeLinear, whose range of an all-NaN input the CPU EP derives \
         by its length (see DynamicQuantizeLinear): NaN scales there, scale 1 in the MLX EP",
    ),
    (
        "Min",
        "huge-shape-value",
        "the CPU EP takes the min of int64 against exactly 2^31 wrongly (Min([9, 9, 9], [2^31, 1, 2^40]) \
         gives [2^31, 1, 9]), as its Clip does",
    ),
    (
        "ReduceMin",
        "nan-inf",
        "the CPU EP's float min has no fixed answer for NaN: ReduceMin of [[-1.5, NaN], [-1.8, 0.3], \
         [0.2, 0.1]] gives -1.8, of [[NaN, -1.5], ...] NaN, and a NaN inside a vectorized span a partial \
         min; the MLX EP passes NaN over",
    ),
    (
        "LSTM",
        "nan-inf",
        "the CPU EP drops a NaN in R: with hidden_size 1 its outputs stay finite even at steps where the \
         hidden state that multiplies the NaN is nonzero; the MLX EP answers NaN there, as ONNX's \
         reference implementation does",
    ),
    (
        "Bernoulli",
        "nan-inf",
        "the CPU EP draws 1 for a probability of -inf and 0 for +inf (its comparison of a uniform \
         draw runs the other way outside [0, 1]); the MLX EP draws 1 where the probability is above \
         the draw, so 0 for -inf and 1 for +inf",
    ),
    (
        "Multinomial",
        "nan-inf",
        "the CPU EP answers the class count itself (an index out of range) for a row without a finite \
         probability, and draws from what remains of a row holding +inf; the MLX EP's categorical \
         draw answers an index within the row",
    ),
    (
        "com.microsoft:MoE",
        "nan-inf",
        "the CPU EP sums the experts' weighted outputs with a compensated (Kahan) sum, which turns \
         infinities into NaN; the MLX EP sums them plainly (inf)",
    ),
    (
        "com.microsoft:QMoE",
        "nan-inf",
        "the CPU EP orders NaN logits as its partial sort leaves them and multiplies infinite scales \
         through its blocked product kernel; the MLX EP's dequantized weights and softmax carry the NaN",
    ),
    (
        "com.microsoft:DynamicQuantizeLSTM",
        "nan-inf",
        "the CPU EP ends a NaN gate input as 0 or 1 (MLAS's logistic and tanh clamp their input with \
         min/max instructions that pass NaN over) and quantizes a NaN hidden value as a bound; the \
         MLX EP answers NaN, as its LSTM and ONNX's reference LSTM do",
    ),
    ("GridSample", "nan-inf", GRID_SAMPLE_NAN),
    ("com.microsoft:GridSample", "nan-inf", GRID_SAMPLE_NAN),
    (
        "RNN",
        "nan-inf",
        "the CPU EP drops NaN and infinities: its HardSigmoid passes NaN over as 0, and with no \
         initial state it leaves the first step's recurrent product out, so a NaN or infinite R does \
         not reach that step (R = inf gives finite first outputs); the MLX EP propagates them, as ONNX's \
         reference implementation does",
    ),
    (
        "GRU",
        "nan-inf",
        "the CPU EP drops NaN and infinities as its RNN does (an infinite or NaN entry of R or B ends as \
         0 or 1 where ONNX's reference implementation answers NaN); the MLX EP answers NaN, as the \
         reference does",
    ),
    (
        "STFT",
        "nan-inf",
        "an infinite input: the CPU EP answers NaN in every bin of the frame; ONNX's reference (NumPy's \
         FFT) gives infinite parts, as the MLX EP does, and the MLX EP's product with the transform \
         matrix gives NaN where a zero twiddle factor meets the infinity",
    ),
    (
        "DFT",
        "nan-inf",
        "an infinite input: the CPU EP answers NaN in every bin; ONNX's reference (NumPy's FFT) gives \
         infinite real parts, as the MLX EP does, and the MLX EP's product with the transform matrix \
         gives NaN where a zero twiddle factor meets the infinity",
    ),
    (
        "ai.onnx.ml:Normalizer",
        "index-out-of-range",
        "the CPU EP squares integers in their own type, which overflows (an int64 of 2^40 squares past \
         2^63); the MLX EP computes in float32",
    ),
    (
        "ai.onnx.ml:Normalizer",
        "huge-shape-value",
        "the CPU EP squares integers in their own type, which overflows past 46340 (L2 of int32 [46341, 1] \
         gives [1, NaN], of [2^31 - 1, 1] gives [0.707, 0.707]); the MLX EP computes in float32",
    ),
];

/// Answers where ORT's CPU EP refuses input that ONNX's definition and its reference
/// implementation accept: `(op, text of the CPU EP's error, why)`; counted as *lenient*. The
/// only answers to a CPU EP error that are excused.
pub const ONNX_WHERE_CPU_REFUSES: &[(&str, &str, &str)] = &[
    (
        "ConvInteger",
        "IsScalarOr1ElementVector(W_Zero_Point) was false",
        "a weight zero point per output channel: ONNX defines it and its node test \
         test_convinteger_with_padding uses one, as the MLX EP does; ORT 1.31's CPU EP refuses it",
    ),
    (
        "Conv",
        "Invalid input shape",
        "an empty spatial axis padded to a window with a constant weight and a bias: every product is \
         with padding, so ONNX's result is the bias, which the MLX EP answers, as the CPU EP does for a \
         runtime weight; with a constant weight the CPU EP refuses the shape",
    ),
    (
        "ReduceMax",
        "is not defined for empty set with bool type",
        "a bool reduction over no elements: ONNX defines it as the identity (false for ReduceMax) and its \
         node test test_reduce_max_empty_set_bool expects that, as the MLX EP answers; ORT 1.31's CPU EP \
         refuses it",
    ),
    (
        "ReduceMin",
        "is not defined for empty set with bool type",
        "a bool reduction over no elements: ONNX defines it as the identity (true for ReduceMin), as the \
         MLX EP answers; ORT 1.31's CPU EP refuses it",
    ),
    (
        "DFT",
        "DFT input signal dimension must be greater than zero",
        "an empty signal axis with a dft_length: ONNX zero-pads the signal to dft_length, so the \
         spectrum is zeros, as the MLX EP and ONNX's reference implementation answer; ORT 1.31's CPU EP \
         refuses it",
    ),
    (
        "Pad",
        "Unexpected mode of 3",
        "wrap padding of an input with an empty axis that is not padded: the result is empty, of the \
         padded shape, as ONNX's reference implementation and the MLX EP answer; ORT 1.31's CPU EP's \
         path for empty inputs has no case for wrap and fails",
    ),
    (
        "Attention",
        "inconsistent total_sequence_length (between attn_mask",
        "a mask shorter than the keys: ONNX's reference implementation pads it with -inf (False), and so \
         does the MLX EP; ORT 1.31's CPU EP refuses it",
    ),
];

/// [`ONNX_OVER_CPU`] for one output only: `(op, attribute, value, output, why)`, excused only
/// where the differing value is in that output.
pub const ONNX_OVER_CPU_OUTPUT: &[(&str, &str, &str, &str, &str)] = &[
    ("Attention", "qk_matmul_output_mode", "1", "qk", QK_MODES),
    ("Attention", "qk_matmul_output_mode", "2", "qk", QK_MODES),
    ("Attention", "qk_matmul_output_mode", "3", "qk", QK_MODES),
];

const BLOCKED_QUANTIZE: &str = "a NaN, an infinity or a quotient past 2^31 quantized in blocks along an axis \
     other than the last: that path of ORT 1.31's CPU EP converts `x / scale` to int32 before adding the \
     zero point, so all of them become INT_MIN, which a negative zero point wraps to the top (int8 \
     `QuantizeLinear(+inf)` with a zero point of 4 gives -128, with -4 gives 127); its other paths, and the \
     MLX EP, saturate infinities and large values and give NaN the type's lowest value";

/// [`CPU_ANSWER_WRONG`] narrowed by the text of the difference: `(op, mutation, text, why)`.
pub const CPU_ANSWER_WRONG_WHERE: &[(&str, &str, &str, &str)] = &[
    (
        "MaxPool",
        "attr-out-of-range",
        // (The CPU EP's answer: float32's lowest value.)
        "vs CPU -3402823466385288",
        "a dilation near 2^63 with a kernel of 1: the CPU EP's window loop steps its position by the \
         dilation past 64 bits (signed overflow) and answers float32's lowest value where the window \
         holds one element; the MLX EP answers that element (each window is its one tap)",
    ),
    ("QuantizeLinear", "nan-inf", "MLX -128 vs CPU 127", BLOCKED_QUANTIZE),
    ("QuantizeLinear", "nan-inf", "MLX 127 vs CPU -128", BLOCKED_QUANTIZE),
    ("QuantizeLinear", "nan-inf", "MLX 255 vs CPU 0", BLOCKED_QUANTIZE),
    // (Integer outputs are compared exactly: atol and rtol 0.)
    ("Max", "huge-shape-value", "atol 0, rtol 0", INT64_MIN_MAX),
    ("Max", "index-out-of-range", "atol 0, rtol 0", INT64_MIN_MAX),
    ("Min", "huge-shape-value", "atol 0, rtol 0", INT64_MIN_MAX),
    ("Min", "index-out-of-range", "atol 0, rtol 0", INT64_MIN_MAX),
];
