// Pad model for the gate-level board simulation (ringkv.sim.gatesim): synth_ecp5 maps the
// platform's IB/OBZ/BB to TRELLIS_IO; the netlist's TRELLIS_IO instances are renamed to
// RINGKV_GATE_PAD, a two-state model of yosys' TRELLIS_IO (share/ecp5/common_sim.vh) that
// does not drive an input pad with 'z' (Verilator rejects that at the top level). A pad whose
// output is disabled (T = 1) is driven to 1 (a pulled-up line) where the real pad floats.
module RINGKV_GATE_PAD(inout B, input I, input T, output O);
  parameter DIR = "INPUT";
  generate
    if (DIR == "INPUT") begin
      assign O = B;
    end else if (DIR == "OUTPUT") begin
      assign B = T ? 1'b1 : I;
      assign O = 1'b0;
    end else begin
      assign B = T ? 1'b1 : I;
      assign O = B;
    end
  endgenerate
endmodule
